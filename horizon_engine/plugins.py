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

An exception a plugin's component, or a plugin's own stage run function, raises during a run is
re-raised as a ``PluginError`` naming the plugin and the component or stage
(``PluginHost.blame``), so that the user knows whose code failed.

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
from types import CodeType, FrameType, ModuleType
from typing import TYPE_CHECKING, Any

import pluggy

from horizon_engine import hookspecs
from horizon_engine.components import (
    FAMILIES,
    Component,
    ComponentConfig,
    component_options,
)
from horizon_engine.errors import HorizonError, PluginError

if TYPE_CHECKING:
    import click

    from horizon_engine.preprocessor import FeatureType
    from horizon_engine.report_page import ReportSection
    from horizon_engine.run_context import RunContext, StageReport
    from horizon_engine.run_folder import RunFolder
    from horizon_engine.stages import SectionRule, Stage

ENTRY_POINT_GROUP = "horizon"

DEFAULT_PLUGINS: tuple[str, ...] = (
    "horizon_engine.core_stages",
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


@dataclass(frozen=True)
class PluginDeprecation:
    """A plugin that loaded, but through a hook that is going away, and what replaces it:
    reported as failures are (by ``horizon plugins`` and once per command), so that its author
    hears of it before the old way stops working."""

    name: str
    entry_point: str
    message: str

    def __str__(self) -> str:
        return f"plugin '{self.name}' ({self.entry_point}) is deprecated: {self.message}"


LEGACY_TRANSFORMS_HOOK = "horizon_register_transforms"
"""The hook timeline engines, normalization engines and feature types once shared; a class
registered through it is routed to its family by its base class."""

LEGACY_TRANSFORMS_ADVICE = (
    f"{LEGACY_TRANSFORMS_HOOK} is deprecated; register timeline engines with "
    "horizon_register_timeline_engines, normalization engines with "
    "horizon_register_normalization_engines and feature types with "
    "horizon_register_feature_types (docs/plugins.md)"
)


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
    def label(self) -> str:
        return self.name


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
    stages: list[Stage] = field(default_factory=list)


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
        self.left_out: list[str] = []
        """Installed plugins not loaded (``HORIZON_DISABLE_PLUGINS``, ``HORIZON_LOAD_PLUGINS``):
        a component asked for that is not registered may be theirs."""
        self.deprecations: list[PluginDeprecation] = []
        self._components: dict[tuple[str, str], RegisteredComponent] = {}
        self._stages: list[Stage] = []
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
                self.left_out.append(name)
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
        self._order_stages()

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
        """The plugin's components, every family's, and its stages, kept all or none: a
        plugin whose register
        hook raises, or registers a component Horizon cannot use, is left out as a failure (as
        one that cannot be imported is), so one plugin's mistake never stops the others, nor
        leaves half of that plugin behind. Plugins are taken in registration order (built-ins
        first), so that a duplicate name is blamed on the plugin that came later."""
        staged: dict[tuple[str, str], RegisteredComponent] = {}
        for family in (*FAMILIES, None):
            hook_name = f"horizon_register_{family}" if family else LEGACY_TRANSFORMS_HOOK
            for impl in getattr(self.pm.hook, hook_name).get_hookimpls():
                if impl.plugin_name != plugin:
                    continue
                try:
                    impl.function(register=partial(self._stage, hook_name, family, plugin, staged))
                except _Refused as refused:
                    self._leave_out(plugin, str(refused))
                    return
                except Exception as exc:
                    error = f"{hook_name} raised {type(exc).__name__}: {exc}"
                    self._leave_out(plugin, error)
                    return
                if family is None:
                    deprecation = PluginDeprecation(
                        plugin, self._entry_point(plugin), LEGACY_TRANSFORMS_ADVICE
                    )
                    self.deprecations.append(deprecation)
        stages: list[Stage] = []
        for impl in self.pm.hook.horizon_register_stages.get_hookimpls():
            if impl.plugin_name != plugin:
                continue
            try:
                impl.function(register=partial(_stage_registered, stages))
            except _Refused as refused:
                self._leave_out(plugin, f"horizon_register_stages registered {refused}")
                return
            except Exception as exc:
                error = f"horizon_register_stages raised {type(exc).__name__}: {exc}"
                self._leave_out(plugin, error)
                return
        self._components.update(staged)
        self.plugins[plugin].components.extend(staged.values())
        self.plugins[plugin].stages.extend(stages)

    def _order_stages(self) -> None:
        """Every plugin's stages in run order (``stages.order_stages``). A plugin whose stage
        cannot be ordered (a name, section or path another stage has, a read no stage writes,
        a cycle) is left out whole, components included, and the rest ordered again."""
        from horizon_engine.stages import StageOrderError, order_stages

        while True:
            registered = [stage for info in self.plugins.values() for stage in info.stages]
            try:
                self._stages = order_stages(registered)
                return
            except StageOrderError as exc:
                plugin = next(
                    info.name for info in self.plugins.values() if exc.stage in info.stages
                )
                self._components = {
                    key: entry for key, entry in self._components.items() if entry.plugin != plugin
                }
                self._leave_out(plugin, f"its stage cannot run: {exc}")

    def _stage(
        self,
        hook_name: str,
        family: str | None,
        plugin: str,
        staged: dict[tuple[str, str], RegisteredComponent],
        cls: type[Component],
    ) -> None:
        """``register`` as the plugin's hook calls it: check ``cls`` and stage it. ``family``
        is None for the deprecated transforms hook, whose classes go to the family their base
        class says."""
        problem = None
        if family is None:
            family, problem = _legacy_family(cls)
        problem = problem or _component_problem(family, cls)
        if problem is not None:
            what = f"{cls.__module__}.{cls.__qualname__}" if isinstance(cls, type) else repr(cls)
            raise _Refused(f"registered {what} in {hook_name}: {problem}")
        entry = RegisteredComponent(cls, plugin)
        key = (family, entry.name)
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

    def stages(self) -> list[Stage]:
        """Every registered stage, in the order a run executes them."""
        return list(self._stages)

    def sections(self) -> dict[str, SectionRule]:
        """The component sections of pipeline.toml (``[pipeline]`` is the core's own), each
        with its rule: one per stage, in stage order."""
        return {stage.section: stage.rule for stage in self._stages}

    def components(self, family: str) -> list[RegisteredComponent]:
        """Every component registered in ``family``, in registration order."""
        return [entry for (fam, _), entry in self._components.items() if fam == family]

    def feature_types(self) -> dict[str, FeatureType]:
        """The normalization types a feature may be given, by name, ready to ``fit``."""
        registered = self.components("feature_types")
        return {entry.name: entry.cls(entry.cls.Config()) for entry in registered}

    def component(self, family: str, name: str) -> RegisteredComponent:
        """The component ``name`` of ``family``, or an error listing what is available."""
        found = self._components.get((family, name))
        if found is not None:
            return found
        available = [entry.label for entry in self.components(family)]
        wanted = name
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
        if self.left_out:
            message += (
                f" Installed plugins not loaded here: {', '.join(self.left_out)} (left out by "
                "HORIZON_DISABLE_PLUGINS or HORIZON_LOAD_PLUGINS)."
            )
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
                    "stages": [
                        {
                            "name": stage.name,
                            "section": stage.section,
                            "reads": list(stage.reads),
                            "reads_when_written": list(stage.reads_when_written),
                            "reads_all": stage.reads_all,
                            "writes": list(stage.claims),
                        }
                        for stage in info.stages
                    ],
                    "components": [
                        {
                            "family": entry.family,
                            "name": entry.name,
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
        component (family and name), or the plugin's stage, whose code raised it, and where;
        None where ``exc`` is not a plugin's own failure: a ``HorizonError`` (its message is
        already meant for the user), a write the disk refused (the command line says how to
        free space), an interrupt, or an exception raised outside every component's methods
        and every plugin's stage run function.

        The culprit is the innermost frame of the traceback whose ``self`` (or ``cls``) is a
        registered component, or that runs a stage's run function its plugin defines, so a
        failure in a library the component or stage calls is still its.
        """
        from horizon_engine.files import WRITE_REFUSED

        if not isinstance(exc, Exception) or isinstance(exc, HorizonError):
            return None
        if isinstance(exc, OSError) and exc.errno in WRITE_REFUSED:
            return None
        components = {entry.cls: entry for entry in self._components.values()}
        found = _raising_code(exc, components, self._own_stage_runs())
        if found is None:
            return None
        culprit, frame, line = found
        if isinstance(culprit, RegisteredComponent):
            info = self.plugins[culprit.plugin]
            whose = f"its {culprit.family} component '{culprit.label}'"
        else:
            info, stage = culprit
            whose = f"its stage '{stage.name}'"
        raised = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
        where = f"{frame.f_code.co_qualname}, {frame.f_globals.get('__name__')} line {line}"
        return PluginError(
            f"plugin '{info.name}' ({info.distribution} {info.version}): {whose} raised "
            f"{raised} (in {where})"
        )

    def _own_stage_runs(self) -> dict[CodeType, tuple[PluginInfo, Stage]]:
        """The code of each stage's run function that its plugin defines itself, with the plugin
        and stage: a function the plugin registers from the core (the world model's
        ``analyze_timeline``, the core's stages' ``pipeline`` functions) is the core's code."""
        runs: dict[CodeType, tuple[PluginInfo, Stage]] = {}
        for info in self.plugins.values():
            package = self.pm.get_plugin(info.name).__name__
            for stage in info.stages:
                module = getattr(stage.run, "__module__", None) or ""
                code = getattr(stage.run, "__code__", None)
                if code is not None and (module == package or module.startswith(package + ".")):
                    runs[code] = (info, stage)
        return runs

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

    def report_sections(self, folder: RunFolder) -> list[ReportSection]:
        """The sections plugins add to ``folder``'s report, each plugin called on its own: one
        that raises gets an absent section naming it and the error, not a failed page."""
        from horizon_engine.report_page import ReportSection

        sections: list[ReportSection] = []
        for impl in self.pm.hook.horizon_report_sections.get_hookimpls():
            try:
                found = impl.function(folder=folder) or []
                if not all(isinstance(section, ReportSection) for section in found):
                    raise TypeError("returned something other than ReportSection objects")
            except Exception as exc:  # a plugin's own failure, whatever it is
                sections.append(
                    ReportSection(
                        f"plugin-{impl.plugin_name}",
                        f"Plugin {impl.plugin_name}",
                        absent=f"plugin '{impl.plugin_name}' failed to build its sections: "
                        f"{type(exc).__name__}: {exc}",
                    )
                )
                continue
            sections.extend(found)
        return sections


def _stage_registered(stages: list[Stage], stage: object) -> None:
    """``register`` as a plugin's ``horizon_register_stages`` calls it: check and keep."""
    from horizon_engine.stages import stage_problem

    problem = stage_problem(stage)
    if problem is not None:
        raise _Refused(f"a stage Horizon cannot use: {problem}")
    stages.append(stage)


def family_bases() -> dict[str, type[Component]]:
    """The base class of each family's components, by family name (as in its hook): the
    family's contract, with its required (abstract) methods."""
    from horizon_engine.components import DataSource
    from horizon_engine.estimation import EstimatorBase
    from horizon_engine.export import ExporterBase
    from horizon_engine.normalization import NormalizationEngine
    from horizon_engine.preprocessor import FeatureType
    from horizon_engine.timeline import TimelineEngine
    from horizon_engine.training import TrainerBase

    bases: tuple[type[Component], ...] = (
        DataSource,
        TimelineEngine,
        NormalizationEngine,
        FeatureType,
        TrainerBase,
        EstimatorBase,
        ExporterBase,
    )
    return {base.family: base for base in bases}


LEGACY_FAMILIES = ("timeline_engines", "normalization_engines", "feature_types")
"""The families the deprecated transforms hook's classes are routed to."""


def _legacy_family(cls: object) -> tuple[str, str | None]:
    """The family a class registered through the deprecated transforms hook belongs to, by its
    base class; or, where it has none of theirs, why it is refused."""
    bases = family_bases()
    for family in LEGACY_FAMILIES:
        if isinstance(cls, type) and issubclass(cls, bases[family]):
            return family, None
    expected = ", ".join(f"horizon_engine.{bases[family].__name__}" for family in LEGACY_FAMILIES)
    return LEGACY_FAMILIES[0], f"expected a subclass of one of {expected}"


def _component_problem(family: str, cls: object) -> str | None:
    """What is wrong with a class registered in ``family``, or None if it can be used.

    Checked at registration so that a plugin's mistake is reported by plugin name when Horizon
    starts, not as an AttributeError (or a half-built object) deep inside a run.
    """
    bases = family_bases()
    base = bases[family]
    if not (isinstance(cls, type) and issubclass(cls, base)):
        expected = f"expected a subclass of horizon_engine.{base.__name__}"
        other = getattr(cls, "family", None) if isinstance(cls, type) else None
        if other in bases and other != family:
            return (
                f"it is a {other} component; {expected} (register it in horizon_register_{other})"
            )
        return expected
    name = getattr(cls, "name", None)
    if not isinstance(name, str) or not name:
        return (
            "it has no name; set the class attribute name = '...' that pipeline.toml selects "
            f"(every horizon_engine.{base.__name__} needs one)"
        )
    if not (isinstance(cls.Config, type) and issubclass(cls.Config, ComponentConfig)):
        return (
            f"its Config is {cls.Config!r}; expected a subclass of horizon_engine.ComponentConfig"
        )
    missing = sorted(getattr(cls, "__abstractmethods__", ()))
    if missing:
        return (
            f"it does not implement {', '.join(missing)}, which horizon_engine."
            f"{base.__name__} requires"
        )
    if family == "feature_types":
        from horizon_engine.normalization import FeatureParameters

        model = getattr(cls, "Parameters", None)
        if not (isinstance(model, type) and issubclass(model, FeatureParameters)):
            return (
                f"its Parameters is {model!r}; expected a subclass of "
                "horizon_engine.FeatureParameters, the model of what the type stores"
            )
    return None


def _raising_code(
    exc: BaseException,
    registered: Mapping[type, RegisteredComponent],
    stage_runs: Mapping[CodeType, tuple[PluginInfo, Stage]],
) -> tuple[RegisteredComponent | tuple[PluginInfo, Stage], FrameType, int] | None:
    """The innermost frame of ``exc``'s traceback run by a registered component (its ``self``
    or ``cls``) or by a plugin's own stage run function, with the component (or the plugin and
    stage) and the frame's line; None if neither's code ran."""
    for frame, line in reversed(list(traceback.walk_tb(exc.__traceback__))):
        owner = frame.f_locals.get("self", frame.f_locals.get("cls"))
        entry = registered.get(owner if isinstance(owner, type) else type(owner))
        if entry is not None:
            return entry, frame, line
        if frame.f_code in stage_runs:
            return stage_runs[frame.f_code], frame, line
    return None


_default_host: PluginHost | None = None


def get_plugin_host() -> PluginHost:
    """The process-wide plugin host, loaded on first use from the current environment."""
    global _default_host
    if _default_host is None:
        _default_host = PluginHost()
    return _default_host
