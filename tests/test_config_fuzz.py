"""Property-based tests of the config loader: whatever a pipeline file or config dict holds
(wrong types, unknown keys, huge numbers, NaN and infinities, any Unicode, lone surrogates,
deep nesting), ``validate`` ends in a spec or a ``HorizonError`` that names the place, never
another exception. Validation only: no example runs a stage."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from horizon_engine.errors import HorizonError
from horizon_engine.pipeline import Engine
from horizon_engine.plugins import PluginHost

pytestmark = pytest.mark.fuzz

SECTIONS = ["pipeline", "source", "timeline", "normalization", "trainer", "export", "evaluation"]
KEYS = [
    "output_dir",
    "seed",
    "on_bad_rows",
    "stages",
    "kind",
    "engine",
    "path",
    "episodes",
    "env",
    "actions",
    "reward",
    "overrides",
    "epochs",
    "layers",
    "learning_rate",
    "minibatch_size",
    "device",
    "warm_start_from",
    "policy",
]
KINDS = ["gym", "jsonl", "parquet", "dqn", "parametric_dqn", "onnx", "local", "sideways"]

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.text(alphabet=st.characters(min_codepoint=0xD800, max_codepoint=0xDFFF), max_size=3),
    st.sampled_from(KINDS),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4)
    ),
    max_leaves=12,
)
sections = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=8), values, max_size=6)
configs = st.dictionaries(
    st.sampled_from(SECTIONS) | st.text(max_size=8), sections | values, max_size=6
)


QUIET = settings(
    suppress_health_check=[
        HealthCheck.function_scoped_fixture,  # tmp_path only holds the file being written
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
    ]
)


@pytest.fixture(scope="module")
def engine() -> Engine:
    return Engine(plugins=PluginHost(env={}), show_progress=False)


def validated_or_refused(engine: Engine, config: object, origin: str) -> None:
    """``validate`` gives a spec, or a HorizonError whose message names ``origin``."""
    try:
        engine.validate(config)
    except HorizonError as exc:
        assert origin in str(exc), str(exc)


@QUIET
@given(config=configs, output=st.sampled_from(["keep", "runs/fuzz", "", "/", "\x00"]))
def test_any_config_dict_is_a_spec_or_an_error_naming_the_place(engine, tmp_path, config, output):
    if output != "keep" and isinstance(config.get("pipeline"), dict):
        config["pipeline"]["output_dir"] = output if output != "runs/fuzz" else str(tmp_path)
    validated_or_refused(engine, config, "<config>")


def toml_value(value: object) -> str:
    """``value`` written as TOML (NaN and infinities as TOML spells them)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return '"' + "".join(f"\\U{ord(c):08x}" if not c.isalnum() else c for c in value) + '"'
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(item) for item in value) + "]"
    return "{" + ", ".join(f'"{key}" = {toml_value(item)}' for key, item in value.items()) + "}"


toml_scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**63 - 1),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(alphabet=st.characters(exclude_categories=("Cs",)), max_size=10),
    st.sampled_from(KINDS),
)
toml_values = st.recursive(
    toml_scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.from_regex(r"[a-z_]{1,6}", fullmatch=True), inner, max_size=3)
    ),
    max_leaves=10,
)
bare_keys = st.sampled_from(KEYS) | st.from_regex(r"[a-z_]{1,8}", fullmatch=True)


@QUIET
@given(
    document=st.dictionaries(
        st.sampled_from(SECTIONS) | st.from_regex(r"[a-z]{1,8}", fullmatch=True),
        st.dictionaries(bare_keys, toml_values, max_size=5),
        max_size=5,
    ),
    depth=st.integers(min_value=0, max_value=3000),
)
def test_any_pipeline_file_is_a_spec_or_an_error_naming_the_file(engine, tmp_path, document, depth):
    lines = []
    for section, body in document.items():
        lines.append(f"[{section}]")
        lines += [f"{key} = {toml_value(value)}" for key, value in body.items()]
    if depth:
        lines.append("[deep]\nvalue = " + "[" * depth + "]" * depth)
    path: Path = tmp_path / "pipeline.toml"
    text = "\n".join(lines) + "\n"
    path.write_text(text, encoding="utf-8")
    validated_or_refused(engine, path, str(path))
