"""Stages are registered, not listed: ``horizon_register_stages``, the run order derived from
what each stage reads, the plugin failures of stages that cannot be ordered, and a plugin's stage
that raises named as the plugin's."""

from __future__ import annotations

import pytest

from horizon_engine import Engine, RunFolder, SectionRule, Stage, StageReport
from horizon_engine.errors import PluginError
from horizon_engine.plugins import PluginHost
from horizon_engine.stages import StageOrderError, order_stages, readers_of, stage_problem

RULE = SectionRule("trainers")


def stage(name: str, reads: tuple[str, ...] = (), claims: tuple[str, ...] = ()) -> Stage:
    """A stage configured by the section of its name, writing ``claims`` (``name/*`` by
    default)."""
    return Stage(name, name, RULE, reads, claims or (f"{name}/*",), lambda *_: StageReport(name))


def names(stages: list[Stage]) -> list[str]:
    return [each.name for each in stages]


def test_the_core_and_the_world_model_register_the_stages_in_their_run_order():
    host = PluginHost(env={"HORIZON_LOAD_PLUGINS": "worldmodel"})
    assert names(host.stages()) == [
        "source",
        "timeline",
        "normalization",
        "train",
        "evaluation",
        "export",
        "analysis",
        "report",
    ]
    assert host.plugins["core_stages"].source == "builtin"
    assert names(host.plugins["worldmodel"].stages) == ["analysis"]
    assert host.sections()["analysis"] == SectionRule("trainers", default_selector="world_model")


def test_without_the_world_model_there_is_no_analysis_stage_nor_section():
    host = PluginHost(env={"HORIZON_LOAD_PLUGINS": ""})
    assert "analysis" not in names(host.stages())
    assert "analysis" not in host.sections()


def test_a_stage_runs_after_the_stages_it_reads_ties_in_registration_order():
    summary = stage("summary", reads=("data/rows",))
    data = stage("data", claims=("data/rows",))
    other = stage("other")
    assert names(order_stages([summary, other, data])) == ["other", "data", "summary"]
    assert names(order_stages([data, summary, other])) == ["data", "summary", "other"]


def test_a_stage_that_reads_every_other_stages_outputs_runs_last_and_goes_stale_with_any():
    from dataclasses import replace

    page = replace(stage("page"), reads_all=True)
    data = stage("data", claims=("data/rows",))
    summary = stage("summary", reads=("data/rows",))
    other = stage("other")
    assert names(order_stages([page, data, summary, other])) == ["data", "summary", "other", "page"]
    assert readers_of(other, [page, data, summary, other]) == ["page"]
    assert readers_of(data, [page, data, summary, other]) == ["page", "summary"]
    with pytest.raises(StageOrderError, match="read each other's outputs"):
        order_stages([page, replace(stage("second"), reads_all=True)])


@pytest.mark.parametrize(
    ("stages", "blamed", "message"),
    [
        ([stage("a"), stage("a")], 1, "stages 'a' and 'a' have one name"),
        (
            [stage("a", claims=("out/x.json",)), stage("b", claims=("out/*",))],
            1,
            "stages 'a' and 'b' both claim 'out/\\*': a path has one writer",
        ),
        (
            [stage("a", claims=("out/*",)), stage("b", claims=("out/x.json",))],
            1,
            "both claim 'out/x.json'",
        ),
        ([stage("a", reads=("nowhere.json",))], 0, "stage 'a' reads 'nowhere.json', which no"),
        ([stage("a", reads=("a/x",))], 0, "stage 'a' reads its own output"),
        (
            [stage("a", reads=("b/x",)), stage("b", reads=("a/x",))],
            1,
            "stages 'a', 'b' read each other's outputs \\(a cycle\\)",
        ),
    ],
)
def test_stages_that_cannot_be_ordered_are_refused_naming_the_later_one(stages, blamed, message):
    with pytest.raises(StageOrderError, match=message) as refused:
        order_stages(stages)
    assert refused.value.stage is stages[blamed]


@pytest.mark.parametrize(
    ("registered", "problem"),
    [
        ("not a stage", "expected a horizon_engine.Stage"),
        (stage("Bad Name"), "stage name 'Bad Name' is not a lowercase word"),
        (
            Stage("a", "pipeline", RULE, (), ("a/x",), print),
            "[pipeline] is the core's own section",
        ),
        (stage("a", claims=("/etc/passwd",)), "is not a path inside the run folder"),
        (stage("a", reads=("../other/x",)), "is not a path inside the run folder"),
        (
            Stage("a", "a", SectionRule(None), (), ("a/x",), print),
            "needs either a component family or",
        ),
        (Stage("a", "a", SectionRule("estimators", many=True), (), ("a/x",), print), "only"),
    ],
)
def test_a_stage_horizon_cannot_use_is_named(registered, problem):
    assert problem in stage_problem(registered)


CLASHING_PLUGIN = """
from horizon_engine import SectionRule, Stage, StageReport, hookimpl


def run(run, choice):
    return StageReport("{name}")


@hookimpl
def horizon_register_stages(register):
    register(Stage("{name}", "{name}", SectionRule("trainers"), ({reads}), ({claims}), run))
"""


@pytest.mark.parametrize(
    ("name", "reads", "claims", "why"),
    [
        ("mine", "", "'model.onnx',", "stages 'export' and 'mine' both claim 'model.onnx'"),
        ("mine", "'nowhere.json',", "'mine/x',", "stage 'mine' reads 'nowhere.json'"),
        ("train", "", "'mine/x',", "stages 'train' and 'train' have one name"),
    ],
)
def test_a_plugin_whose_stage_cannot_be_ordered_is_left_out_and_the_others_load(
    plugin_site, name, reads, claims, why
):
    source = CLASHING_PLUGIN.format(name=name, reads=reads, claims=claims)
    plugin_site.install("clashing", "1.0", {"clashing": "clashing"}, {"clashing.py": source})
    host = PluginHost(env={"HORIZON_LOAD_PLUGINS": "clashing,worldmodel"})
    assert "clashing" not in host.plugins
    [failure] = host.failures
    assert failure.name == "clashing"
    assert f"its stage cannot run: {why}" in failure.error
    assert "analysis" in names(host.stages())


def test_a_stage_registered_wrong_leaves_its_plugin_out_with_the_reason(plugin_site):
    source = """
        from horizon_engine import hookimpl

        @hookimpl
        def horizon_register_stages(register):
            register("a stage")
    """
    plugin_site.install("wrong", "1.0", {"wrong": "wrong"}, {"wrong.py": source})
    host = PluginHost(env={"HORIZON_LOAD_PLUGINS": "wrong"})
    [failure] = host.failures
    assert "horizon_register_stages registered a stage Horizon cannot use" in failure.error
    assert "expected a horizon_engine.Stage, found 'a stage'" in failure.error


RAISING_STAGE_PLUGIN = """
from horizon_engine import ComponentConfig, SectionRule, Stage, StageReport, hookimpl


class TallyOptions(ComponentConfig):
    pass


def tally(run, choice):
    counts = {}
    return StageReport("tally", rows_out=counts["rows"])


@hookimpl
def horizon_register_stages(register):
    rule = SectionRule(None, options=TallyOptions)
    register(Stage("tally", "tally", rule, reads=(), claims=("tally/*",), run=tally))
"""


def test_a_plugin_stages_own_exception_names_the_plugin_and_stage_in_the_error_and_manifest(
    plugin_site, tmp_path
):
    modules = {"tallying.py": RAISING_STAGE_PLUGIN}
    plugin_site.install("horizon-plugin-tallying", "2.0", {"tallying": "tallying"}, modules)
    host = PluginHost(env={"HORIZON_LOAD_PLUGINS": "tallying"})
    config = {"pipeline": {"output_dir": str(tmp_path)}, "tally": {}}

    with pytest.raises(PluginError) as error:
        Engine(plugins=host, show_progress=False).run(config)

    message = str(error.value)
    assert message.startswith(
        "plugin 'tallying' (horizon-plugin-tallying 2.0): its stage 'tally' raised KeyError: "
        "'rows' (in tally, tallying line "
    )
    assert isinstance(error.value.__cause__, KeyError)
    manifest = RunFolder(tmp_path).manifest()
    assert (manifest["status"], manifest["failed_stage"], manifest["error"]) == (
        "failed",
        "tally",
        message,
    )
