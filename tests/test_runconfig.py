"""The run configuration is declared once (``harness.runconfig``): the command line and the
pytest plugin offer the same options from it and build the same ``RunConfig`` from the same
values; the launch plan carries it to the ranks whole."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from harness.cli import _parser
from harness.protocol import LaunchPlan
from harness.runconfig import (
    CLI,
    PYTEST,
    RunConfig,
    add_pytest_options,
    from_namespace,
    from_pytest,
    options,
    pytest_flag,
)

#: the same run, as ``harness run`` arguments (the pytest plugin takes them as --fsdp-compat-<flag>)
ARGS = ["--scenario", "plain", "--scenario", "hsdp", "--world-size", "2", "--variant", "patched", "--patches",
        "my_patches", "--patch-map", "a=b", "--timeout", "12", "--scenarios-dir", "extra", "--isolate", "fork",
        "--shuffle", "5", "--init", "meta", "--fault", "all", "--dump", "dumps", "--expect-torch", "2.13.0",
        "--out", "runs/x.jsonl"]


class _Group:
    """pytest's option group, on argparse (pytest's ``addoption`` takes argparse's arguments)."""

    def __init__(self) -> None:
        self.parser = argparse.ArgumentParser()

    def addoption(self, *flags: str, **kw) -> None:
        self.parser.add_argument(*flags, **kw)


class _PytestConfig:
    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace

    def getoption(self, name: str):
        return getattr(self.namespace, name)


def _from_pytest(args: list[str]) -> RunConfig:
    group = _Group()
    add_pytest_options(group)
    flags = {opt.flag: pytest_flag(opt) for _, opt in options(PYTEST)}
    return from_pytest(_PytestConfig(group.parser.parse_args([flags.get(a, a) for a in args])))


def test_the_command_line_and_the_pytest_plugin_build_the_same_config_from_the_same_values():
    cli = from_namespace(_parser().parse_args(["run", *ARGS]))
    plugin = _from_pytest(ARGS)
    assert cli.with_(run_id="r") == plugin.with_(run_id="r")
    assert cli.scenarios == ["plain", "hsdp"] and cli.world_sizes == [2] and cli.patch_mapping == {"a": "b"}
    assert cli.timeout_s == 12.0 and cli.dump == Path("dumps") and cli.init == "meta" and cli.shuffle == 5
    assert cli.faults == ["grad_rel", "sign_flip", "drop_micro_batch", "double_rank"]  # "all", each in turn


def test_options_not_given_take_the_fields_defaults():
    cli, plugin = from_namespace(_parser().parse_args(["run"])), _from_pytest([])
    default = RunConfig()
    for config in (cli, plugin):
        assert config.with_(run_id=default.run_id, out=default.out) == default
    assert cli.devices == ["cpu"] and cli.variants == ["vanilla", "patched", "deployed", "api"]


def test_every_field_is_offered_on_the_command_line_and_the_plugin_offers_all_but_the_launch_layout_and_reuse():
    names = {f for f, _ in options(CLI)}
    assert names == set(RunConfig.__dataclass_fields__)
    help_text = _parser()._subparsers._group_actions[0].choices["run"].format_help()  # noqa: SLF001
    assert all(opt.flag in help_text for _, opt in options(CLI))
    assert names - {f for f, _ in options(PYTEST)} == {"per", "run_id", "nnodes", "node_rank", "rdzv_endpoint",
                                                        "reuse_from"}


@pytest.mark.parametrize("kw,message", [
    (dict(nnodes=2), "multi-node runs need --rdzv-endpoint"),
    (dict(nnodes=2, node_rank=2, rdzv_endpoint="h:1", run_id="r"), "--node-rank must be in [0, 2)"),
])
def test_a_bad_combination_is_one_value_error(kw, message):
    with pytest.raises(ValueError) as error:
        RunConfig(**kw)
    assert str(error.value).startswith(message)


def test_a_bad_value_on_the_command_line_is_one_line_naming_the_option(capsys):
    with pytest.raises(SystemExit) as exit_:
        _parser().parse_args(["run", "--timeout", "-1"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.strip() == "error: run: argument --timeout: must be a finite number of seconds > 0, got '-1'"


def test_the_launch_plan_carries_the_config_to_the_ranks_whole(tmp_path):
    config = from_namespace(_parser().parse_args(["run", *ARGS]))
    plan = LaunchPlan(config=config, run_id="r", launch_id="L", device="cpu", world_size=2, patches_module_id="m",
                      out_path=str(tmp_path / "o.jsonl"), folder=str(tmp_path))
    assert LaunchPlan.load(plan.dump()).config == config
