"""The plugin manager: built-in plugins and entry points on one pluggy manager.

Built-in features are plugins registered exactly like third-party ones (pytest's ``_pytest``
idea): ``DEFAULT_PLUGINS`` lists the core's own modules, and every other plugin, the in-repo
``horizon_plugins_*`` packages included, is found through the ``horizon`` entry-point group.

Environment:
- ``HORIZON_DISABLE_PLUGINS=a,b`` blocks plugins by name (built-in ones too).
- ``HORIZON_LOAD_PLUGINS=a,b`` loads only these entry-point plugins (built-ins still load).

A plugin that fails to import, implements a hook that does not exist, declares an argument its
hook does not pass, or registers a component Horizon cannot use (short of its family's contract,
or with a name another plugin's component already has) is reported by name and entry point and
left out whole; the others still load. Of two components with one name, the later plugin's is
the one left out, and the failure names both.

An exception a plugin's component raises during a run is re-raised as a ``PluginError`` naming
the plugin and the component (``PluginHost.blame``), so that the user knows whose code failed.

Core code never calls ``pm.hook`` directly: it goes through ``PluginHost``'s typed methods.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.metadata
import os
import traceback
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from functools import partial
from types import FrameType, ModuleType
from typing import TYPE_CHECKING, Any

import pluggy

from horizon_engine import hookspecs
from horizon_engine.components import (
    FAMILIES,
    FAMILY_BASES,
    Component,
    ComponentConfig,
    component_options,
)
from horizon_engine.errors import HorizonError, PluginError

if TYPE_CHECKING:
    import click

    from horizon_engine.run_context import RunContext, StageReport

ENTRY_POINT_GROUP = "horizon"

DEFAULT_PLUGINS: tuple[str, ...] = (
    "horizon_engine.builtin.sources",
    "horizon_engine.builtin.timeline",
    "horizon_engine.builtin.normalization",
    "horizon_engine.builtin.tensorboard",
    "horizon_engine.builtin.onnx_export",
    "horizon_engine.builtin.feature_types",
    "horizon_engine.builtin.estimators",
    "horizon_engine.builtin.gym",
)
"""Modules of the core's own plugins, registered under their last dotted name."""

HOOK_NAMES: tuple[str, ...] = tuple(
    sorted(name for name in vars(hookspecs) if name.startswith("horizon_"))
)
"""Every hook a plugin may implement, for suggesting the nearest one to a misspelt name."""


@dataclass(frozen=True)
class PluginFailure:
    """A plugin that could not be loaded, and why."""

    name: str
    entry_point: str
    error: str

    def __str__(self) -> str:
        return f"plugin '{self.name}' ({self.entry_point}) failed to load: {self.error}"

    @property
    def remedy(self) -> str:
        """How to stop being told: the plugin left out on purpose is no longer a failure."""
        return f"disable it with HORIZON_DISABLE_PLUGINS={self.name}"


class _Refused(Exception):
    """A component Horizon cannot use, raised out of the plugin's register hook to stop it."""


@dataclass(frozen=True)
class RegisteredComponent:
    """A component class together with the plugin that registered it."""

    cls: type[Component]
    plugin: str

    @property
    def family(self) -> str:
        return self.cls.family

    @property
    def name(self) -> str:
        return self.cls.name

    @property
    def engine(self) -> str | None:
        return getattr(self.cls, "engine", None) if self.family == "transforms" else None

    @property
    def label(self) -> str:
        return f"{self.name} (engine {self.engine})" if self.engine else self.name


@dataclass
class PluginInfo:
    """One loaded plugin as ``horizon plugins`` shows it."""

    name: str
    version: str
    source: str
    hooks: list[str] = field(default_factory=list)
    components: list[RegisteredComponent] = field(default_factory=list)
    commands: list[str] = field(default_factory=list)
    distribution: str = "horizon-engine"


def _split_names(value: str | None) -> set[str] | None:
    if value is None:
        return None
    return {name.strip() for name in value.split(",") if name.strip()}


def _horizon_version() -> str:
    from horizon_engine import __version__

    return __version__


class PluginHost:
    """Loads plugins into one pluggy manager and gives the core typed access to them."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        env = os.environ if env is None else env
        self.blocked = _split_names(env.get("HORIZON_DISABLE_PLUGINS")) or set()
        self.allowed = _split_names(env.get("HORIZON_LOAD_PLUGINS"))
        self.pm = pluggy.PluginManager("horizon")
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.failures: list[PluginFailure] = []
        self._components: dict[tuple[str, str, str | None], RegisteredComponent] = {}
        self._load()

    def _load(self) -> None:
        for module_name in DEFAULT_PLUGINS:
            name = module_name.rsplit(".", 1)[-1]
            if name in self.blocked:
                continue
            self._register(
                name, importlib.import_module(module_name), _horizon_version(), "builtin"
            )
        for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            name = entry_point.name
            if name in self.blocked or (self.allowed is not None and name not in self.allowed):
                continue
            if name in self.plugins:
                taken = self.plugins[name].source
                self.failures.append(
                    PluginFailure(
                        name,
                        entry_point.value,
                        f"another plugin is already called {name!r} ({taken})",
                    )
                )
                continue
            try:
                module = entry_point.load()
            except Exception as exc:
                self.failures.append(
                    PluginFailure(
                        name, entry_point.value, f"import failed: {type(exc).__name__}: {exc}"
                    )
                )
                continue
            dist = entry_point.dist
            version = dist.version if dist is not None else "unknown"
            distribution = dist.name if dist is not None else "?"
            source = f"{distribution} ({entry_point.value})"
            self._register(name, module, version, source, entry_point.value, distribution)
        # Every plugin's hooks were checked against the specs as it was registered; pluggy's
        # own check confirms that nothing unknown slipped through.
        self.pm.check_pending()
        for plugin in list(self.plugins):
            self._collect_components(plugin)

    def _register(
        self,
        name: str,
        module: ModuleType,
        version: str,
        source: str,
        entry_point: str = "",
        distribution: str = "horizon-engine",
    ) -> None:
        loaded_as = self.pm.get_name(module)
        if loaded_as is not None:
            problem: str | None = f"its module is already loaded as plugin '{loaded_as}'"
        else:
            problem = self._hook_problem(module, name)
        if problem is None:
            try:
                self.pm.register(module, name=name)
            except pluggy.PluginValidationError as exc:
                # Older pluggy versions leave a half-registered plugin behind.
                if self.pm.is_registered(module):
                    self.pm.unregister(module)
                problem = f"cannot be registered: {exc}".replace("\n", "; ")
        if problem is not None:
            self.failures.append(PluginFailure(name, entry_point or module.__name__, problem))
            return
        hooks = sorted(caller.name for caller in self.pm.get_hookcallers(module) or [])
        self.plugins[name] = PluginInfo(name, version, source, hooks, distribution=distribution)

    def _hook_problem(self, module: ModuleType, name: str) -> str | None:
        """Why the module's hook implementations cannot be used, or None if they can.

        pluggy accepts an implementation of a hook it has no spec for (a later plugin might add
        the spec) and only ``check_pending()`` finds it, with a message naming neither the
        nearest hook nor the arguments. Horizon's hooks are all known up front, so a misspelt
        hook or argument is reported here, before the plugin is registered, instead of the
        implementation silently never being called.
        """
        for attribute in dir(module):
            options = self.pm.parse_hookimpl_opts(module, attribute)
            if options is None or options.get("optionalhook"):
                continue
            hook_name = options.get("specname") or attribute
            caller = getattr(self.pm.hook, hook_name, None)
            if caller is None or caller.spec is None:
                close = difflib.get_close_matches(hook_name, HOOK_NAMES, n=1)
                hint = f"; did you mean '{close[0]}'?" if close else ""
                return f"implements unknown hook '{hook_name}'{hint}"
            impl = pluggy.HookImpl(module, name, getattr(module, attribute), options)
            unexpected = [arg for arg in impl.argnames if arg not in caller.spec.argnames]
            if unexpected:
                return (
                    f"hook '{hook_name}' declares unknown argument(s) {', '.join(unexpected)}; "
                    f"the hook passes {', '.join(caller.spec.argnames)}"
                )
        return None

    def _collect_components(self, plugin: str) -> None:
        """The plugin's components, every family's, kept all or none: a plugin whose register
        hook raises, or registers a component Horizon cannot use, is left out as a failure (as
        one that cannot be imported is), so one plugin's mistake never stops the others, nor
        leaves half of that plugin behind. Plugins are taken in registration order (built-ins
        first), so that a duplicate name is blamed on the plugin that came later."""
        staged: dict[tuple[str, str, str | None], RegisteredComponent] = {}
        for family in FAMILIES:
            hook = getattr(self.pm.hook, f"horizon_register_{family}")
            for impl in hook.get_hookimpls():
                if impl.plugin_name != plugin:
                    continue
                try:
                    impl.function(register=partial(self._stage, family, plugin, staged))
                except _Refused as refused:
                    self._leave_out(plugin, str(refused))
                    return
                except Exception as exc:
                    error = f"horizon_register_{family} raised {type(exc).__name__}: {exc}"
                    self._leave_out(plugin, error)
                    return
        self._components.update(staged)
        self.plugins[plugin].components.extend(staged.values())

    def _stage(
        self,
        family: str,
        plugin: str,
        staged: dict[tuple[str, str, str | None], RegisteredComponent],
        cls: type[Component],
    ) -> None:
        """``register`` as the plugin's hook calls it: check ``cls`` and stage it."""
        problem = _component_problem(family, cls)
        if problem is not None:
            what = f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else repr(cls)
            raise _Refused(f"registered {what} in horizon_register_{family}: {problem}")
        entry = RegisteredComponent(cls, plugin)
        key = (family, entry.name, entry.engine)
        earlier = self._components.get(key) or staged.get(key)
        if earlier is not None:
            raise _Refused(
                f"two plugins register the {family} component '{entry.label}': "
                f"'{earlier.plugin}' ({earlier.cls.__module__}.{earlier.cls.__qualname__}) and "
                f"'{plugin}' ({cls.__module__}.{cls.__qualname__}); '{plugin}' is left out "
                f"(HORIZON_DISABLE_PLUGINS={earlier.plugin} leaves out the other instead)"
            )
        staged[key] = entry

    def _leave_out(self, plugin: str, error: str) -> None:
        """Unregister ``plugin`` (its hooks are never called) and record why."""
        entry_point = self._entry_point(plugin)
        self.pm.unregister(name=plugin)
        del self.plugins[plugin]
        self.failures.append(PluginFailure(plugin, entry_point, error))

    def components(self, family: str) -> list[RegisteredComponent]:
        """Every component registered in ``family``, in registration order."""
        return [entry for (fam, _, _), entry in self._components.items() if fam == family]

    def feature_types(self) -> set[str]:
        """The normalization types a feature may be given: the transforms that are feature
        types, not the timeline or normalization engines registered in the same hook."""
        from horizon_engine.preprocessor import FeatureTransform

        return {
            entry.name
            for entry in self.components("transforms")
            if issubclass(entry.cls, FeatureTransform)
        }

    def component(self, family: str, name: str, engine: str | None = None) -> RegisteredComponent:
        """The component ``name`` of ``family``, or an error listing what is available."""
        found = self._components.get((family, name, engine))
        if found is not None:
            return found
        available = [entry.label for entry in self.components(family)]
        wanted = f"{name} (engine {engine})" if engine else name
        message = f"no {family} component '{wanted}' is registered"
        close = difflib.get_close_matches(wanted, available, n=1)
        if close:
            message += f"; did you mean '{close[0]}'?"
        else:
            message += "."
        message += f" Available: {', '.join(available) or 'none'}."
        if self.failures:
            failed = ", ".join(failure.name for failure in self.failures)
            message += f" Plugins that failed to load: {failed} (see `horizon plugins`)."
        raise PluginError(message)

    def describe(self) -> list[dict[str, Any]]:
        """The listing behind ``horizon plugins``: plugins, hooks, components and their options."""
        listing = []
        for info in self.plugins.values():
            listing.append(
                {
                    "name": info.name,
                    "version": info.version,
                    "source": info.source,
                    "hooks": info.hooks,
                    "commands": info.commands,
                    "components": [
                        {
                            "family": entry.family,
                            "name": entry.name,
                            **({"engine": entry.engine} if entry.engine else {}),
                            "summary": entry.cls.summary(),
                            "options": component_options(entry.cls),
                        }
                        for entry in info.components
                    ],
                }
            )
        return listing

    def versions(self) -> dict[str, str]:
        """Plugin name -> version, as the run manifest records them."""
        return {info.name: info.version for info in self.plugins.values()}

    def load_failures(self) -> list[dict[str, str]]:
        """Each plugin that failed to load (name, entry point, error), as the run manifest
        records them: a run without a plugin it was meant to have must say so."""
        return [asdict(failure) for failure in self.failures]

    def register_commands(self, cli: click.Group) -> None:
        """Add every plugin's ``horizon_register_commands`` commands to ``cli``.

        Each plugin adds to a group of its own, then its commands join ``cli`` one by one: a
        name already taken (by the core or an earlier plugin) is refused and recorded as a
        failure, as is a plugin whose hook raised, and the other plugins' commands still load.
        """
        import click

        hook = self.pm.hook.horizon_register_commands
        for impl in hook.get_hookimpls():
            plugin = impl.plugin_name
            staging = click.Group(name=cli.name)
            entry_point = self._entry_point(plugin)
            try:
                impl.function(cli=staging)
            except Exception as exc:
                error = f"horizon_register_commands raised {type(exc).__name__}: {exc}"
                self.failures.append(PluginFailure(plugin, entry_point, error))
                continue
            for name, command in staging.commands.items():
                if name in cli.commands:
                    error = f"its command 'horizon {name}' is refused: the name is taken"
                    self.failures.append(PluginFailure(plugin, entry_point, error))
                    continue
                cli.add_command(command, name)
                self.plugins[plugin].commands.append(name)

    def _entry_point(self, plugin: str) -> str:
        source = self.plugins[plugin].source
        if "(" in source:
            return source[source.find("(") + 1 : -1]
        return self.pm.get_plugin(plugin).__name__

    def blame(self, exc: BaseException) -> PluginError | None:
        """``exc`` as an error naming the plugin (its distribution and version) and the
        component (family and name) whose code raised it, and where; None where ``exc`` is not
        a component's own failure: a ``HorizonError`` (its message is already meant for the
        user), a write the disk refused (the command line says how to free space), an
        interrupt, or an exception raised outside every component's methods.

        The component is the innermost frame of the traceback whose ``self`` (or ``cls``) is
        a registered component, so a failure in a library the component calls is still its.
        """
        from horizon_engine.files import WRITE_REFUSED

        if not isinstance(exc, Exception) or isinstance(exc, HorizonError):
            return None
        if isinstance(exc, OSError) and exc.errno in WRITE_REFUSED:
            return None
        found = _raising_component(exc, {entry.cls: entry for entry in self._components.values()})
        if found is None:
            return None
        entry, frame, line = found
        info = self.plugins[entry.plugin]
        raised = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        where = f"{frame.f_code.co_qualname}, {frame.f_globals.get('__name__')} line {line}"
        return PluginError(
            f"plugin '{info.name}' ({info.distribution} {info.version}): its {entry.family} "
            f"component '{entry.label}' raised {raised} (in {where})"
        )

    # The typed façade over the lifecycle hooks: core code calls these, never ``pm.hook``.

    def on_stage_start(self, run: RunContext, stage: str) -> None:
        """Tell plugins a stage is about to run."""
        self.pm.hook.horizon_on_stage_start(run=run, stage=stage)

    def on_stage_end(self, run: RunContext, stage: str, report: StageReport) -> None:
        """Tell plugins a stage finished, with its report."""
        self.pm.hook.horizon_on_stage_end(run=run, stage=stage, report=report)

    def on_epoch_end(self, run: RunContext, epoch: int, metrics: dict[str, float]) -> None:
        """Tell plugins (reporters such as TensorBoard) a training epoch ended, with its metrics."""
        self.pm.hook.horizon_on_epoch_end(run=run, epoch=epoch, metrics=metrics)

    def on_run_end(self, run: RunContext, manifest: dict[str, Any]) -> None:
        """Tell plugins the run ended, successfully or not, with its manifest."""
        self.pm.hook.horizon_on_run_end(run=run, manifest=manifest)


def family_contract(family: str, name: object) -> type[Component]:
    """The base class a component of ``family`` named ``name`` must subclass: the family's
    contract, with its required (abstract) methods. Transforms share one hook but not one
    contract: ``timeline`` engines build the timeline, ``normalization`` engines sample it, and
    every other name is a feature type (a normalization ``feature_type``)."""
    from horizon_engine.estimation import EstimatorBase
    from horizon_engine.export import ExporterBase
    from horizon_engine.normalization import NormalizationTransform
    from horizon_engine.preprocessor import FeatureTransform
    from horizon_engine.timeline import TimelineTransform
    from horizon_engine.training import TrainerBase

    if family == "transforms":
        engines = {"timeline": TimelineTransform, "normalization": NormalizationTransform}
        return engines.get(name, FeatureTransform) if isinstance(name, str) else FeatureTransform
    contracts = {"trainers": TrainerBase, "estimators": EstimatorBase, "exporters": ExporterBase}
    return contracts.get(family, FAMILY_BASES[family])


def _component_problem(family: str, cls: object) -> str | None:
    """What is wrong with a class registered in ``family``, or None if it can be used.

    Checked at registration so that a plugin's mistake is reported by plugin name when Horizon
    starts, not as an AttributeError (or a half-built object) deep inside a run.
    """
    base = FAMILY_BASES[family]
    if not (isinstance(cls, type) and issubclass(cls, base)):
        expected = f"expected a subclass of horizon_engine.{base.__name__}"
        for other, other_base in FAMILY_BASES.items():
            if isinstance(cls, type) and issubclass(cls, other_base):
                return f"it is a {other} component; {expected} (register it in the right hook)"
        return expected
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        return "it has no name; set the class attribute name = '...' that pipeline.toml selects"
    if not (isinstance(cls.Config, type) and issubclass(cls.Config, ComponentConfig)):
        return (
            f"its Config is {cls.Config!r}; expected a subclass of horizon_engine.ComponentConfig"
        )
    contract = family_contract(family, name)
    if not issubclass(cls, contract):
        return (
            f"a component named '{name}' in horizon_register_{family} must subclass "
            f"horizon_engine.{contract.__name__}"
        )
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        return (
            f"it does not implement {', '.join(missing)}, which horizon_engine."
            f"{contract.__name__} requires"
        )
    return None


def _raising_component(
    exc: BaseException, registered: Mapping[type, RegisteredComponent]
) -> tuple[RegisteredComponent, FrameType, int] | None:
    """The innermost frame of ``exc``'s traceback run by a registered component (its ``self``
    or ``cls``), with the component and the frame's line; None if no component's code ran."""
    for frame, line in reversed(list(traceback.walk_tb(exc.__traceback__))):
        owner = frame.f_locals.get("self", frame.f_locals.get("cls"))
        entry = registered.get(owner if isinstance(owner, type) else type(owner))
        if entry is not None:
            return entry, frame, line
    return None


_default_host: PluginHost | None = None


def get_plugin_host() -> PluginHost:
    """The process-wide plugin host, loaded on first use from the current environment."""
    global _default_host
    if _default_host is None:
        _default_host = PluginHost()
    return _default_host
