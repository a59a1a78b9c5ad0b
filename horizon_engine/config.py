"""pipeline.toml -> a typed, validated pipeline specification.

Each section chooses a registered component (by ``kind``, or by ``engine`` for the timeline)
and that component's own pydantic model validates the rest of the section, so a plugin owns
its options and the core owns the messages. Every message names the file, the section, the key
(with its line when it can be found), what was expected and what was found, and suggests the
nearest valid key for a misspelt one.
"""

from __future__ import annotations

import difflib
import json
import math
import re
import tomllib
import types
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal, Union, get_args, get_origin

from pydantic import Field, ValidationError, field_validator

from horizon_engine.components import Component, ComponentConfig, DistinctNames
from horizon_engine.errors import ConfigError, HorizonError, PluginError
from horizon_engine.plugins import PluginHost, RegisteredComponent, get_plugin_host
from horizon_engine.row_values import text_problem
from horizon_engine.stages import SectionRule


class PipelineSection(ComponentConfig):
    """The ``[pipeline]`` section: options of the run as a whole."""

    output_dir: str = "runs/pipeline"
    """Folder the run writes its stages' outputs and manifest.json into (which folders it may
    not be: ``horizon_engine.run_folder.output_dir_problem``)."""
    seed: int = Field(default=0, ge=0, le=2**63 - 1)
    """Seed for every random choice of the run (collection, splits, training)."""
    on_bad_rows: Literal["fail", "quarantine"] = "fail"
    """Stop at invalid rows, or set them aside in quarantine/ with their reasons and go on."""
    name: str | None = None
    """A name for the run, recorded in the manifest."""
    stages: DistinctNames | None = Field(default=None, min_length=1)
    """Run only these stages (as ``--stages`` does); None runs every configured stage."""

    @field_validator("output_dir")
    @classmethod
    def _names_a_folder(cls, output_dir: str) -> str:
        """An empty name would write into the current folder; a NUL byte is in no path."""
        if not output_dir.strip():
            raise ValueError('names no folder; name one, such as "runs/pipeline"')
        if "\x00" in output_dir:
            raise ValueError("holds a NUL byte, which no path can hold")
        return output_dir


DEFAULT_BODIES: dict[str, dict[str, Any]] = {
    "timeline": {},
    "normalization": {},
    "export": {"kind": "onnx"},
    "report": {},
}
"""The sections a pipeline may leave out though its stages need them, and what each runs with
when left out (``implied_sections`` says when): its defaults, and for ``[export]`` the one
exporter every installation has."""


MAX_NESTING = 32
"""How deep arrays and tables may nest in a config: deeper than any option needs, and far
from the depth at which Python's recursion (tomllib's, pydantic's) would fail."""

INTEGER_LIMIT = 2**31 - 1
"""The largest value of an integer option (an item of a list of integers too) whose model sets
no upper bound of its own: beyond any count or size a run can use (``epochs = 1e12`` would
train for ever, a layer of that width could never be allocated)."""

FLOAT_LIMIT = 1e9
"""The largest magnitude of a float option (an item of a list or a value of a map too) whose
model sets no upper bound of its own: a weight, coefficient or scale (``cql_alpha``, a reward
weight, ``temperature``) a billion times another term erases it in float32, which keeps 7
digits, and a size past it (``max_memory_gb = 1e9`` is an exabyte) is beyond any machine
(``1e300`` GiB is no number of bytes at all). Options with a bound of their own (``gamma``,
``eval_fraction``, ``LearningRate``) keep it."""


@dataclass(frozen=True)
class Choice:
    """A section's chosen component (None for a section that selects none: ``SectionRule``)
    and its validated config."""

    section: str
    component: RegisteredComponent | None
    config: ComponentConfig
    rule: SectionRule

    def create(self) -> Component:
        if self.component is None:
            raise HorizonError(f"[{self.section}] selects no component to create")
        return self.component.cls(self.config)

    def resolved(self) -> dict[str, Any]:
        options = self.config.model_dump(mode="json")
        if self.component is None:
            return options
        return {self.rule.selector: self.component.name, **options}


@dataclass
class PipelineSpec:
    """A validated pipeline.toml: the run options and each section's component."""

    origin: str
    pipeline: PipelineSection
    sections: dict[str, Choice] = field(default_factory=dict)
    evaluation: list[Choice] = field(default_factory=list)
    locate: _Locator | None = None
    """Finds a key's line in the file, for checks made after loading (``where``)."""
    at_defaults: list[str] = field(default_factory=list)
    """The sections in ``sections`` that the file leaves out, which run at their defaults
    because the stages it configures need them (``implied_sections``)."""
    rules: dict[str, SectionRule] = field(default_factory=dict)
    """Every section the registered stages are configured by, in stage order, with its rule
    (``PluginHost.sections``)."""

    def where(self, section: str, key: str | None = None) -> str:
        """``file:line`` of ``key`` in ``[section]`` (or of the section), for messages."""
        return self.locate.where(section, key) if self.locate else self.origin

    def settings_origin(self, section: str) -> str:
        """Where ``[section]``'s settings come from, for ``horizon validate``: its header's
        line in the file, the ``--set`` options that made it, or its defaults."""
        header = f"[[{section}]]" if self.rules[section].many else f"[{section}]"
        if section in self.at_defaults:
            return f"defaults (no {header} section)"
        if self.locate is None:
            return f"{header} in {self.origin}"
        return self.locate.origin_of(section, header)

    def resolved(self) -> dict[str, Any]:
        """The config as resolved, defaults filled in, as the manifest records it."""
        resolved: dict[str, Any] = {"pipeline": self.pipeline.model_dump(mode="json")}
        for name, choice in self.sections.items():
            resolved[name] = choice.resolved()
        if self.evaluation:
            resolved["evaluation"] = [choice.resolved() for choice in self.evaluation]
        return resolved


def parse_override(text: str) -> tuple[list[str], Any]:
    """``trainer.learning_rate=0.01`` -> (["trainer", "learning_rate"], 0.01).

    The value is read as a TOML value (numbers, booleans, strings in quotes, arrays); a bare
    word that is not valid TOML is taken as a string, so ``--set source.env=CartPole-v1`` works.
    """
    if "=" not in text:
        raise ConfigError([f"--set {text!r}: expected SECTION.KEY=VALUE"])
    dotted, raw = text.split("=", 1)
    path = [part.strip() for part in dotted.split(".")]
    if len(path) < 2 or not all(path):
        raise ConfigError([f"--set {text!r}: expected SECTION.KEY=VALUE"])
    try:
        value = tomllib.loads(f"value = {raw}")["value"]
    except tomllib.TOMLDecodeError:
        value = raw
    except RecursionError:
        raise ConfigError([f"--set {dotted}: the value nests too deeply to read"]) from None
    return path, value


def apply_overrides(raw: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """A copy of ``raw`` with each ``--set`` override applied."""
    result = _deep_copy(raw)
    for text in overrides:
        path, value = parse_override(text)
        target: Any = result
        for part in path[:-1]:
            if isinstance(target, list):
                if not part.isdigit() or int(part) >= len(target):
                    raise ConfigError([f"--set {text!r}: no item {part!r} in that list"])
                target = target[int(part)]
            else:
                target = target.setdefault(part, {})
            if not isinstance(target, dict | list):
                raise ConfigError([f"--set {text!r}: {part!r} is a value, not a section"])
        if isinstance(target, list):
            raise ConfigError([f"--set {text!r}: give the item number, e.g. evaluation.0.kind"])
        target[path[-1]] = value
    return result


def _deep_copy(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _deep_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_deep_copy(item) for item in value]
    return value


def load_toml(path: str | Path, what: str = "pipeline file") -> tuple[dict[str, Any], str]:
    """Read a pipeline.toml (or another TOML config, ``what`` naming it in messages), turning
    syntax errors into a message naming the file and line (a key or table given twice, as
    every other mistake, with its section and key: ``_twice``). A UTF-8 byte order mark, which
    some editors write and TOML does not allow, is skipped."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8-sig")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the {what} ({exc.strerror})"]) from None
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{path}: not a text file in UTF-8 ({exc.reason})"]) from None
    try:
        return tomllib.loads(text), text
    except RecursionError:
        raise ConfigError(
            [f"{path}: arrays or tables nest too deeply to read (at most {MAX_NESTING} deep)"]
        ) from None
    except tomllib.TOMLDecodeError as exc:
        # tomllib gives the line only inside its message: "... (at line 3, column 12)".
        line = re.search(r"at line (\d+)", str(exc))
        where = f"{path}:{line.group(1)}" if line else str(path)
        twice = _twice(text, int(line.group(1)), str(exc)) if line else None
        raise ConfigError([f"{where}: {twice or f'not valid TOML: {exc}'}"]) from None


def _twice(text: str, number: int, message: str) -> str | None:
    """What line ``number`` of ``text`` gives a second time (tomllib's ``message``: "Cannot
    overwrite a value", "Cannot declare ... twice", "Duplicate inline table key"), in the
    words of every other mistake: the section, the key and the line that first gave it; None
    when the line gives nothing twice (another syntax error)."""
    lines = [line.split("#")[0].strip() for line in text.splitlines()]
    if not 0 < number <= len(lines):
        return None
    written = lines[number - 1]
    header = re.fullmatch(r"\[\[?\s*([^\[\]]+?)\s*\]\]?", written)
    if header:
        # The header of a table already declared (an array of tables repeats its own).
        name = header.group(1)
        declared = rf"\[\s*{re.escape(name)}\s*\]"
        first = next(
            (index for index, line in enumerate(lines, 1) if re.fullmatch(declared, line)), None
        )
        if first is None or first >= number:
            return None
        return (
            f"[{name}] is declared twice (first at line {first}); give each of its keys once, "
            "under one header"
        )
    key = written.split("=")[0].strip()
    if "=" not in written or not key:
        return None
    section, first = "", None
    for index, line in enumerate(lines[: number - 1], start=1):
        if line.startswith("["):
            section, first = line.strip("[] "), None
        elif "=" in line and line.split("=")[0].strip() == key:
            first = index
    place = f"[{section}] key" if section else "key"
    name = key.strip("\"'")
    inline = re.match(r"Duplicate inline table key '(.+)'", message)
    if inline:
        return f"{place} '{name}' gives '{inline.group(1)}' twice in its inline table; keep one"
    if first is None or not message.startswith("Cannot overwrite a value"):
        return None
    return f"{place} '{name}' is given twice (first at line {first}); keep one"


class _Locator:
    """Finds the line of ``key`` in ``[section]`` of the TOML text, for messages.

    ``section`` "" is the top level, before any header. A key set by a ``--set`` override is
    named as that override instead, since its line in the file holds another value.
    """

    def __init__(self, origin: str, text: str | None, overridden: Iterable[str] = ()) -> None:
        self.origin = origin
        self.lines = text.splitlines() if text else []
        self.overridden = set(overridden)

    def where(self, section: str, key: str | None = None, index: int | None = None) -> str:
        dotted = ".".join(str(part) for part in (section, index, key) if part is not None)
        if key is not None and dotted in self.overridden:
            return f"{self.origin} (--set {dotted})"
        line = self._find(section, key, index)
        return f"{self.origin}:{line}" if line else self.origin

    def origin_of(self, section: str, header: str) -> str:
        """``header`` (``[section]`` or ``[[section]]``) with the lines it is written on, or
        the ``--set`` options that made it when the file does not hold it."""
        lines = self._header_lines(section)
        if lines:
            numbers = ", ".join(str(number) for number in lines)
            return f"{header} in {self.origin} line{'s' * (len(lines) > 1)} {numbers}"
        made = sorted(key for key in self.overridden if key.split(".")[0] == section)
        if made:
            return f"{header} from " + ", ".join(f"--set {key}" for key in made)
        return f"{header} in {self.origin}"

    def _header_lines(self, section: str) -> list[int]:
        return [
            number
            for number, line in enumerate(self.lines, start=1)
            if line.strip().startswith("[")
            and line.strip().strip("[]").split("#")[0].strip().strip("]").strip() == section
        ]

    def _find(self, section: str, key: str | None, index: int | None) -> int | None:
        current, count, header_line = "", -1, None
        for number, line in enumerate(self.lines, start=1):
            stripped = line.strip()
            if stripped.startswith("["):
                name = stripped.strip("[]").split("#")[0].strip().strip("]").strip()
                current = name
                if name == section:
                    count += 1
                    if index is None or count == index:
                        header_line = number
                continue
            in_section = current == section and (index is None or count == index)
            if in_section and key and stripped.split("=")[0].strip().strip("\"'") == key:
                return number
        return header_line


class ConfigBuilder:
    """Validates a raw config dict against the registered components.

    Problems are collected, not raised one by one, so a file's mistakes are reported together;
    ``build`` validates a pipeline, and ``horizon gym train`` validates gym.toml with the same
    pieces (``check_section_names``, ``validate``, ``choose``).
    """

    def __init__(
        self,
        plugins: PluginHost,
        origin: str,
        text: str | None = None,
        overridden: Iterable[str] = (),
    ) -> None:
        self.plugins = plugins
        self.origin = origin
        self.locate = _Locator(origin, text, overridden)
        self.problems: list[str] = []
        self.sections = plugins.sections()
        """The sections the registered stages are configured by, each with its rule."""

    def rule(self, section: str) -> SectionRule:
        """How ``section`` picks its component; a section no registered stage is configured by
        is an error (its stage's plugin is not loaded)."""
        if section not in self.sections:
            raise ConfigError(
                [
                    f"{self.origin}: no registered stage is configured by [{section}]; see "
                    "`horizon plugins` for the stages and the plugins that failed to load"
                ]
            )
        return self.sections[section]

    def build(self, raw: Mapping[str, Any]) -> PipelineSpec:
        self.check_values(raw)
        if self.problems:
            raise ConfigError(self.problems)
        self.check_section_names(raw, ["pipeline", *self.sections], "pipeline", PipelineSection)
        pipeline = self.validate("pipeline", PipelineSection, raw.get("pipeline", {}), None)
        spec = PipelineSpec(
            self.origin, pipeline or PipelineSection(), locate=self.locate, rules=self.sections
        )
        for name, rule in self.sections.items():
            if name not in raw:
                continue
            if rule.many:
                items = raw[name]
                if not isinstance(items, list):
                    found = f"a single table [{name}]" if isinstance(items, dict) else repr(items)
                    self.problems.append(
                        f"{self.locate.where(name)}: [{name}] must be an array of tables, one "
                        f"[[{name}]] header per item; found {found}"
                    )
                    continue
                for index, item in enumerate(items):
                    choice = self.choose(name, rule, item, index)
                    if choice is not None:
                        spec.evaluation.append(choice)
            else:
                choice = self.choose(name, rule, raw[name], None)
                if choice is not None:
                    spec.sections[name] = choice
        # Which sections are implied is known once the written ones are valid; until then a
        # stage of a section that could be implied is not reported as lacking its section.
        implied = implied_sections(spec) if not self.problems else [*DEFAULT_BODIES, "evaluation"]
        if pipeline is not None:
            self.check_stages(pipeline.stages, [*raw, *implied])
        if self.problems:
            raise ConfigError(self.problems)
        for name in implied:
            if name == "evaluation":
                spec.evaluation = self.default_evaluation()
                spec.at_defaults.append(name)
                continue
            choice = self.choose(name, self.sections[name], dict(DEFAULT_BODIES[name]))
            if choice is not None:
                spec.sections[name] = choice
                spec.at_defaults.append(name)
        spec.sections = {
            name: spec.sections[name] for name in self.sections if name in spec.sections
        }
        if self.problems:
            raise ConfigError(self.problems)
        return spec

    def default_evaluation(self) -> list[Choice]:
        """The ``[[evaluation]]`` entries a pipeline that writes none runs: each registered
        estimator's ``default_entries``, in registration order."""
        rule = self.sections["evaluation"]
        choices = []
        for component in self.plugins.components(rule.family):
            for entry in getattr(component.cls, "default_entries", ()):
                body = {rule.selector: component.name, **entry}
                choice = self.choose("evaluation", rule, body, len(choices))
                if choice is not None:
                    choices.append(choice)
        return choices

    def check_values(self, raw: Mapping[str, Any]) -> None:
        """Report what no option can hold, before any model reads it: nesting deeper than
        ``MAX_NESTING`` (once per key), a key that is not a string, a string that is not
        valid Unicode (a lone surrogate, from a config dict), and NaN."""
        for path, why in unreadable_values(raw):
            section = path[0] if len(path) > 1 else ""
            key = path[1] if len(path) > 1 else path[0]
            place = f"[{section}] key" if section else "key"
            self.problems.append(f"{self.locate.where(section, key)}: {place} {key!r} {why}")

    def check_stages(self, stages: list[str] | None, configured: Iterable[str]) -> None:
        """Report each name in ``[pipeline] stages`` that is not a stage, or whose section is
        not among the ``configured`` ones (written, or run at its defaults)."""
        configured = set(configured)
        where = self.locate.where("pipeline", "stages")
        sections = {stage.name: stage.section for stage in self.plugins.stages()}
        for name in stages or []:
            if name not in sections:
                close = difflib.get_close_matches(name, list(sections), n=1)
                hint = f"; did you mean '{close[0]}'?" if close else "."
                self.problems.append(
                    f"{where}: [pipeline] key 'stages': unknown stage '{name}'{hint} "
                    f"Stages: {', '.join(sections)}."
                )
            elif sections[name] not in configured:
                self.problems.append(
                    f"{where}: [pipeline] key 'stages': stage '{name}' has no "
                    f"[{sections[name]}] section; add the section or leave the stage out"
                )

    def check_section_names(
        self,
        raw: Mapping[str, Any],
        known: list[str],
        home: str,
        home_model: type[ComponentConfig],
    ) -> None:
        """Report every top-level name of ``raw`` that is not a section in ``known``: a key
        above every header (suggesting ``[home]`` when ``home_model`` has it) or an unknown
        section (suggesting the nearest known one)."""
        many = {name for name, rule in self.sections.items() if rule.many}
        headers = [f"[[{s}]]" if s in many else f"[{s}]" for s in known]
        for name, value in raw.items():
            if name in known:
                continue
            if not isinstance(value, dict | list):
                # A key above every header, such as `seed = 0` meant for [pipeline].
                place = f"[{home}]" if name in home_model.model_fields else "its section"
                self.problems.append(
                    f"{self.locate.where('', name)}: key '{name}' is outside any section; "
                    f"move it under {place}. Sections: {', '.join(headers)}."
                )
                continue
            close = difflib.get_close_matches(name, known, n=1)
            hint = f"; did you mean [{close[0]}]?" if close else "."
            self.problems.append(
                f"{self.locate.where(name)}: unknown section [{name}]{hint} "
                f"Valid sections: {', '.join(headers)}."
            )

    def choose(
        self, section: str, rule: SectionRule, body: Any, index: int | None = None
    ) -> Choice | None:
        """The component ``body`` selects by ``rule.selector``, its options validated by the
        component's config model; None (with the problems recorded) when either fails.
        ``index`` numbers the items of an array of tables."""
        label = f"{section}[{index}]" if index is not None else section
        where = self.locate.where(section, rule.selector, index)
        if not isinstance(body, dict):
            self.problems.append(
                f"{where}: [{label}] must be a table, found {type(body).__name__} {body!r}"
            )
            return None
        if rule.family is None:
            config = self.validate(label, rule.options, body, index)
            return Choice(label, None, config, rule) if config is not None else None
        selected = body.get(rule.selector, rule.default_selector)
        if selected is None:
            available = [entry.label for entry in self.plugins.components(rule.family)]
            self.problems.append(
                f"{where}: [{label}] needs '{rule.selector} = ...' to choose a component; "
                f"available: {', '.join(available) or 'none'}"
            )
            return None
        try:
            component = self.plugins.component(rule.family, str(selected))
        except PluginError as exc:
            self.problems.append(f"{where}: [{label}] {rule.selector} = {selected!r}: {exc}")
            return None
        options = {key: value for key, value in body.items() if key != rule.selector}
        config = self.validate(label, component.cls.Config, options, index, component)
        return Choice(label, component, config, rule) if config is not None else None

    def validate(
        self,
        label: str,
        model: type[ComponentConfig],
        options: Any,
        index: int | None = None,
        component: RegisteredComponent | None = None,
    ) -> Any:
        """``options`` validated by ``model``, or None with a problem recorded per mistake."""
        section = label.split("[")[0]
        if not isinstance(options, dict):
            self.problems.append(
                f"{self.locate.where(section)}: [{label}] must be a table, "
                f"found {type(options).__name__}"
            )
            return None
        owner = f" of {component.family} component '{component.label}'" if component else ""
        try:
            config = model.model_validate(options)
        except ValidationError as exc:
            for error in _merge_union_errors(model, exc.errors(), options):
                if error["loc"]:
                    problem = self._describe(label, section, index, model, error, owner)
                else:
                    problem = self._describe_whole(label, section, index, model, error, owner)
                self.problems.append(problem)
            return None
        found = [
            f"{self.locate.where(section, key, index)}: [{label}] key '{key}'{owner}: {why}; "
            f"found {_toml_text(options[key])}"
            for key, why in _option_problems(model, config)
            if key in options
        ]
        self.problems += found
        return None if found else config

    def _describe_whole(
        self,
        label: str,
        section: str,
        index: int | None,
        model: type[ComponentConfig],
        error: Any,
        owner: str,
    ) -> str:
        """A model validator's error: it has no field location, so the keys it is about are
        the section's own keys that its message names; the first of them gives the line."""
        message = _plain_message(error)
        written = error["input"] if isinstance(error["input"], dict) else {}
        involved = [
            key
            for key in written
            if key in model.model_fields and re.search(rf"\b{re.escape(key)}\b", message)
        ]
        where = self.locate.where(section, involved[0] if involved else None, index)
        if not involved:
            return f"{where}: [{label}] options{owner}: {message}"
        names = ", ".join(f"'{key}'" for key in involved)
        found = ", ".join(f"{key} = {_toml_text(written[key])}" for key in involved)
        plural = "s" if len(involved) > 1 else ""
        return f"{where}: [{label}] key{plural} {names}{owner}: {message}; found {found}"

    def _describe(
        self,
        label: str,
        section: str,
        index: int | None,
        model: type[ComponentConfig],
        error: Any,
        owner: str,
    ) -> str:
        loc = [str(part) for part in error["loc"]]
        key = ".".join(loc)
        where = self.locate.where(section, loc[0], index)
        valid = list(model.model_fields)
        if error["type"] == "extra_forbidden":
            close = difflib.get_close_matches(loc[-1], valid, n=1, cutoff=0.6)
            hint = f"; did you mean '{close[0]}'?" if close else "."
            return (
                f"{where}: [{label}] unknown key '{key}'{owner}{hint} "
                f"Valid keys: {', '.join(valid) or 'none'}."
            )
        if error["type"] == "missing":
            annotation = model.model_fields[loc[0]].annotation if loc[0] in valid else None
            expected = _type_text(annotation)
            return f"{where}: [{label}] missing required key '{key}'{owner} (expected {expected})"
        message = _plain_message(error)
        if message.startswith("Input should be "):
            message = "expected " + message.removeprefix("Input should be ")
        found = error.get("input")
        return (
            f"{where}: [{label}] key '{key}'{owner}: {message}; "
            f"found {found!r} ({type(found).__name__})"
        )


_PYDANTIC_PREFIX = re.compile(r"^(Value error|Assertion failed), ")
"""What pydantic puts before the message of a ValueError or AssertionError a validator raised:
the user wants the validator's own words."""


def _plain_message(error: Any) -> str:
    """A pydantic error's message without pydantic's prefix."""
    message = _PYDANTIC_PREFIX.sub("", error["msg"]).strip()
    return message or "the component's check of its options failed without saying why"


def _toml_text(value: Any) -> str:
    """A value as it is written in TOML (``[16]``, ``["relu", "relu"]``, ``false``)."""
    try:
        return json.dumps(value)
    except (TypeError, ValueError):
        return repr(value)


def _type_text(annotation: Any) -> str:
    """``int``, ``list[str]``, ``str | list[str]``: a type as the user would write it."""
    if isinstance(annotation, type):
        return annotation.__name__
    return str(annotation).replace("typing.", "")


def _merge_union_errors(
    model: type[ComponentConfig], errors: list[Any], options: dict[str, Any]
) -> list[Any]:
    """One error per key of a union type such as ``str | list[str]``.

    pydantic reports a value that fits no member once per member, with the member in the
    location (``path.str``, ``path.list[str].1``); the user wants one message about ``path``.
    """
    merged, done = [], set()
    for error in errors:
        loc = error["loc"]
        field = model.model_fields.get(loc[0]) if loc and isinstance(loc[0], str) else None
        members = (
            [arg for arg in get_args(field.annotation) if arg is not type(None)] if field else []
        )
        is_union = field is not None and get_origin(field.annotation) in (Union, types.UnionType)
        if not (is_union and len(members) > 1 and len(loc) > 1):
            merged.append(error)
        elif loc[0] not in done:
            done.add(loc[0])
            merged.append(
                {
                    "type": "union",
                    "loc": loc[:1],
                    "msg": f"expected {_type_text(field.annotation)}",
                    "input": options[loc[0]],
                }
            )
    return merged


def unreadable_values(raw: Mapping[str, Any]) -> list[tuple[tuple[str, ...], str]]:
    """(the place, why) of each value of ``raw`` that no option can hold: see
    ``ConfigBuilder.check_values``. Walked without recursion, so any depth is safe."""
    found: dict[tuple[str, ...], str] = {}
    pending: list[tuple[tuple[str, ...], Any, Any, int]] = [((), None, raw, 0)]
    while pending:
        path, key, value, depth = pending.pop()
        if key is not None and not isinstance(key, str):
            found.setdefault(path[:2], f"holds the key {key!r}, which is not a string")
            continue
        if isinstance(key, str) and text_problem(key):
            found.setdefault(path[:2], "holds a key that is not valid Unicode")
            continue
        if depth > MAX_NESTING:
            found.setdefault(path[:2], f"nests arrays or tables more than {MAX_NESTING} deep")
        elif isinstance(value, Mapping):
            pending += [((*path, str(k)), k, item, depth + 1) for k, item in value.items()]
        elif isinstance(value, list | tuple):
            pending += [((*path, str(i)), None, item, depth + 1) for i, item in enumerate(value)]
        elif isinstance(value, str) and text_problem(value):
            found.setdefault(path[:2], "holds a string that is not valid Unicode")
        elif isinstance(value, float) and math.isnan(value):
            found.setdefault(path[:2], "holds nan, which is no option's value")
    return sorted(found.items())


def _option_problems(
    model: type[ComponentConfig], config: ComponentConfig
) -> list[tuple[str, str]]:
    """(key, why) for each option a model accepted that still cannot be meant, where the model
    sets no upper bound of its own: an integer beyond ``INTEGER_LIMIT`` (an item of a list
    too), a float beyond ``FLOAT_LIMIT`` (an item of a list or a value of a map too: a map of
    weights; a map's integers may be another program's settings, such as Spark's sizes in
    bytes). Infinity and NaN no option takes (``ComponentConfig``); a list that must not
    repeat a name says so in its type (``DistinctNames``)."""
    found = []
    for name, info in type(config).model_fields.items():
        value = getattr(config, name, None)
        mapped = isinstance(value, Mapping)
        if mapped:
            items = list(value.values())
        else:
            items = list(value) if isinstance(value, list | tuple) else [value]
        if any(hasattr(rule, "le") or hasattr(rule, "lt") for rule in info.metadata):
            continue
        numbers = [item for item in items if isinstance(item, int | float)]
        integers = [
            item
            for item in numbers
            if isinstance(item, int) and not isinstance(item, bool) and not mapped
        ]
        huge = [item for item in integers if abs(item) > INTEGER_LIMIT]
        huge_floats = [
            item for item in numbers if isinstance(item, float) and abs(item) > FLOAT_LIMIT
        ]
        if huge:
            found.append((name, f"{huge[0]} is beyond any count or size (at most {INTEGER_LIMIT})"))
        elif huge_floats:
            found.append(
                (
                    name,
                    f"{huge_floats[0]:g} is beyond any weight, scale or size an option takes "
                    f"(at most {FLOAT_LIMIT:g} either way)",
                )
            )
    return found


def implied_sections(spec: PipelineSpec) -> list[str]:
    """The sections of ``DEFAULT_BODIES`` that ``spec`` leaves out though its stages need them:
    the data stages (timeline, normalization) between ``[source]`` and any later section, and
    the export of a trainer whose model is a policy, the report of any pipeline, and
    ``[[evaluation]]`` (each estimator's ``default_entries``) for a trainer of a policy whose
    timeline holds episodes out: the verdict on the policy is what a run is for.

    Without ``[source]`` the data stages are not implied: such a pipeline trains on the
    timeline and normalization its output folder already holds (a user's own), and the
    engine's validation names ``[source]`` when they are not there. A trainer that analyses
    data (the world model) learns a model of the environment, not a policy, so nothing is
    exported for it unless ``[export]`` asks.
    """
    configured = set(spec.sections) | ({"evaluation"} if spec.evaluation else set())
    order = list(spec.rules)
    implied = [
        name
        for name in ("timeline", "normalization")
        if name not in configured
        and "source" in configured
        and any(order.index(later) > order.index(name) for later in configured)
    ]
    trainer = spec.sections.get("trainer")
    if "export" not in configured and trainer and trainer.component.cls.trains_policy:
        implied.append("export")
    if "report" not in configured and configured:
        implied.append("report")
    if "evaluation" not in configured and "evaluation" in spec.rules and _holds_out(spec):
        implied.append("evaluation")
    return implied


def _holds_out(spec: PipelineSpec) -> bool:
    """Whether ``spec`` trains a policy that the evaluation stage can judge: its trainer
    trains one and its timeline (configured or at its defaults) holds episodes out."""
    trainer = spec.sections.get("trainer")
    if trainer is None or not trainer.component.cls.trains_policy:
        return False
    timeline = spec.sections.get("timeline")
    eval_fraction = getattr(timeline.config, "eval_fraction", None) if timeline else None
    return eval_fraction is None or eval_fraction > 0


def build_spec(
    source: str | Path | Mapping[str, Any],
    plugins: PluginHost,
    overrides: Iterable[str] = (),
) -> PipelineSpec:
    """Load (from a path or a dict), apply ``--set`` overrides, and validate."""
    if isinstance(source, Mapping):
        raw, text, origin = dict(source), None, "<config>"
    else:
        raw, text = load_toml(source)
        origin = str(source)
    checked = ConfigBuilder(plugins, origin, text)
    checked.check_values(raw)  # before the overrides copy it, recursively
    if checked.problems:
        raise ConfigError(checked.problems)
    overrides = list(overrides)
    raw = apply_overrides(raw, overrides)
    overridden = [".".join(parse_override(override)[0]) for override in overrides]
    return ConfigBuilder(plugins, origin, text, overridden).build(raw)


@dataclass(frozen=True)
class ConfigSections:
    """A config file of a command's own (``load_config_sections``): its own sections' options,
    the pipeline sections it shares with their chosen components, and where each key is
    written, for the checks the command makes across sections."""

    origin: str
    options: dict[str, ComponentConfig]
    """Each of the command's own sections, validated by its model (its defaults when left
    out)."""
    choices: dict[str, Choice]
    """Each shared pipeline section the file configures, validated as in pipeline.toml."""
    locate: _Locator

    def where(self, section: str, key: str | None = None) -> str:
        """``file:line`` of ``key`` in ``[section]`` (or of the section), for messages."""
        return self.locate.where(section, key)


def load_config_sections(
    source: str | Path | Mapping[str, Any],
    own: Mapping[str, type[ComponentConfig]],
    shared: Iterable[str],
    overrides: Iterable[str] = (),
    plugins: PluginHost | None = None,
    *,
    what: str = "config file",
    required: Mapping[str, str] | None = None,
) -> ConfigSections:
    """Load a command's config file (a path or a dict), apply ``--set`` overrides, and validate
    it: the sections in ``own`` by their models (a key above every header is suggested to go
    in the first of them), the pipeline sections in ``shared`` (such as
    ``trainer`` and ``export``) exactly as pipeline.toml's, against ``plugins``' components
    (the process's plugins when None). ``required`` maps a shared section the file must have
    to the problem reported without it. Every mistake, a misspelt section included, is
    reported at once with the file, line, section and key (``ConfigError``)."""
    if isinstance(source, str | Path):
        raw, text = load_toml(source, what)
        origin = str(source)
    else:
        raw, text, origin = dict(source), None, "<config>"
    overrides = list(overrides)
    raw = apply_overrides(raw, overrides)
    overridden = [".".join(parse_override(override)[0]) for override in overrides]
    builder = ConfigBuilder(plugins or get_plugin_host(), origin, text, overridden)
    shared = list(shared)
    home, home_model = next(iter(own.items()))
    builder.check_section_names(raw, [*own, *shared], home, home_model)
    options = {
        name: builder.validate(name, model, raw.get(name, {})) for name, model in own.items()
    }
    choices = {
        name: builder.choose(name, builder.rule(name), raw[name]) for name in shared if name in raw
    }
    for name, problem in (required or {}).items():
        if name not in raw:
            builder.problems.append(f"{origin}: {problem}")
    if builder.problems:
        raise ConfigError(builder.problems)
    return ConfigSections(origin, options, choices, builder.locate)
