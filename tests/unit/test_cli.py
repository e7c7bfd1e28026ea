"""CLI: the contract's flags exist with their defaults; bad values fail clearly."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest

from histoserve.commands.main import main
from predictor.cli import available_cpus, build_parser, configs_from_args, early_frontends
from predictor.config import BatchingConfig, LimitsConfig, ModelConfig
from predictor.errors import ConfigError


def test_contract_flags_and_defaults():
    args = build_parser().parse_args([])
    assert args.model_dir == Path("/opt/ml/model")
    assert args.checkpoint is None and args.spec is None and args.model_name is None
    assert args.device == "auto"
    assert args.http_port == 8080 and args.grpc_port == 8081
    model, batching, limits = configs_from_args(args)
    assert batching.max_batch_size >= 1 and batching.max_queue_size >= batching.max_batch_size
    assert model.preprocess_workers >= 1 and limits.max_body_bytes > 5_000_000


def test_flags_reach_the_configs():
    args = build_parser().parse_args(
        [
            "--max_batch_size",
            "16",
            "--max_latency_ms",
            "2.5",
            "--max_queue_size",
            "64",
            "--preprocess_workers",
            "3",
            "--device",
            "cuda:1",
            "--model_name",
            "enc",
        ]
    )
    model, batching, _ = configs_from_args(args)
    assert (batching.max_batch_size, batching.max_latency_ms, batching.max_queue_size) == (
        16,
        2.5,
        64,
    )
    assert (model.preprocess_workers, model.device, model.model_name) == (3, "cuda:1", "enc")


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (["--max_batch_size", "0"], "max_batch_size"),
        (["--max_batch_size", "64", "--max_queue_size", "8"], "max_queue_size"),
        (["--device", "tpu"], "tpu"),
    ],
)
def test_bad_values_name_themselves(flags, needle):
    with pytest.raises(ValueError, match=needle):
        configs_from_args(build_parser().parse_args(flags))


def test_startup_error_exits_2_with_one_line(tmp_path, capsys):
    assert main(["serve", "--model_dir", str(tmp_path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and err[0].startswith("histoserve: cannot start") and str(tmp_path) in err[0]
    )


def test_more_than_one_worker_is_refused_at_start(tmp_path, capsys):
    assert main(["--model_dir", str(tmp_path), "--workers", "2"]) == 2
    assert "--workers must be 1" in capsys.readouterr().err


@pytest.mark.parametrize(
    "flags",
    [["--max_batch_size", "0"], ["--drain_timeout_s", "-1"]],
    ids=["batching", "server"],
)
def test_bad_flag_values_are_usage_errors_exit_2(tmp_path, capsys, flags):
    assert main(["serve", "--model_dir", str(tmp_path), *flags]) == 2
    assert capsys.readouterr().err.startswith("histoserve: cannot start")


def test_flag_checks_raise_the_usage_error_of_the_error_tree():
    from predictor.device.faults import parse_fault_spec

    with pytest.raises(ConfigError, match="max_batch_size"):
        configs_from_args(build_parser().parse_args(["--max_batch_size", "0"]))
    with pytest.raises(ConfigError, match="--fault_injection"):
        parse_fault_spec("nth:x")


def test_a_bug_during_start_up_is_a_traceback_not_a_usage_error(tmp_path, monkeypatch, capsys):
    """A ValueError no check of ours raised is a bug: it must escape (exit 1 with its
    traceback), not read as "cannot start" exit 2. The bug is planted with monkeypatch:
    a real one cannot be written on purpose."""
    from predictor import startup

    def buggy_build_model(*args, **kwargs):
        return int("not a number")  # the kind of ValueError a bug raises

    monkeypatch.setattr(startup, "build_model", buggy_build_model)
    with pytest.raises(ValueError, match="invalid literal for int"):
        main(["serve", "--model_dir", str(tmp_path)])
    assert "cannot start" not in capsys.readouterr().err


def test_available_cpus_follows_the_cgroup_quota(tmp_path):
    cpu_max = tmp_path / "cpu.max"
    cpu_max.write_text("150000 100000\n")
    assert available_cpus(cpu_max) == min(2, available_cpus(tmp_path / "absent"))
    cpu_max.write_text("max 100000\n")
    assert available_cpus(cpu_max) == available_cpus(tmp_path / "absent") >= 1


def test_grpc_message_cap_follows_the_body_limit_unless_set():
    args = build_parser().parse_args(["--max_body_bytes", "9000000"])
    assert args.grpc_max_receive_message_length is None
    args = build_parser().parse_args(["--grpc_max_receive_message_length", "1234"])
    assert args.grpc_max_receive_message_length == 1234


def test_model_class_flag_reaches_the_config():
    assert configs_from_args(build_parser().parse_args([]))[0].model_class is None
    args = build_parser().parse_args(["--model_class", "my_models:Mine"])
    assert configs_from_args(args)[0].model_class == "my_models:Mine"


@pytest.mark.parametrize(
    ("target", "needle"),
    [
        ("no_such_module_xyz:Model", "cannot import 'no_such_module_xyz'"),
        ("harness.seed_model:BLANK_BELOW", "is not a subclass of predictor.BaseServerModel"),
    ],
)
def test_a_model_class_that_cannot_serve_exits_2_with_one_line(
    embedding_package_dir, capsys, target, needle
):
    flags = ["--model_dir", str(embedding_package_dir), "--device", "cpu"]
    assert main([*flags, "--model_class", target]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("histoserve: cannot start"), err
    assert needle in err[0] and target in err[0]


def test_frontends_are_read_before_anything_heavy_is_imported():
    assert early_frontends(["--model_dir", "/m"]) == (1, None)
    assert early_frontends(["--frontends", "auto"]) == (max(1, available_cpus() - 1), None)
    flags = ["--frontends", "2", "--frontend_socket", "/s", "--frontend_index", "1"]
    assert early_frontends(flags) == (2, 1)
    with pytest.raises(ValueError, match="--frontends"):
        early_frontends(["--frontends", "0"])


def test_frontends_flag_is_in_the_parser_with_its_default():
    args = build_parser().parse_args(["--model_dir", "/m"])
    assert args.frontends == "1" and args.frontend_socket is None


@pytest.mark.parametrize(("value", "want"), [(None, None), ("auto", None), ("3", 3)])
def test_instances_per_device_defaults_to_auto(value, want):
    args = build_parser().parse_args([] if value is None else ["--instances_per_device", value])
    model, _, _ = configs_from_args(args)
    assert model.instances_per_device == want


def test_load_probe_flags_are_checked(capsys):
    args = build_parser().parse_args(["--load_probe", "on", "--load_timeout_s", "12.5"])
    model = configs_from_args(args)[0]
    assert (model.load_probe, model.load_timeout_s) == ("on", 12.5)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--load_probe", "sometimes"])
    assert "--load_probe" in capsys.readouterr().err
    with pytest.raises(ConfigError, match="load_timeout_s must be > 0"):
        configs_from_args(build_parser().parse_args(["--load_timeout_s", "0"]))


def test_a_bad_instance_count_names_the_flag(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--instances_per_device", "two"])
    assert "--instances_per_device" in capsys.readouterr().err


# The contract's histoserve flags (/work/shared/DESIGN.md): none may be renamed or lost.
CONTRACT_FLAGS = {
    *("--model_dir", "--checkpoint", "--spec", "--device", "--max_batch_size"),
    *("--max_latency_ms", "--max_queue_size", "--preprocess_workers", "--drain_timeout_s"),
    *("--max_tiles_per_request", "--max_tiles_per_slide", "--max_image_pixels"),
    *("--max_body_bytes", "--forward_runner", "--instances_per_device", "--rest_fast_path"),
    *("--model_class", "--allow_tf32", "--frontends", "--bind_address", "--metrics_port"),
    *("--load_probe", "--load_timeout_s"),
}


def test_each_server_flag_is_one_field_that_gives_flag_default_and_help():
    from predictor.cli import FLAG_GROUPS
    from predictor.flags import declared

    parser = build_parser()
    actions = {a.dest: a for a in parser._actions}
    titles = {g.title: {a.dest for a in g._group_actions} for g in parser._action_groups}
    for config, title in FLAG_GROUPS:
        for field, flag in declared(config):
            action = actions[field.name]
            wanted = available_cpus() if field.name == "preprocess_workers" else field.default
            assert action.default == wanted, field.name
            assert (field.name in titles[title]) != flag.kserve, field.name
            assert action.option_strings == [f"--{field.name}"]
            if not flag.kserve:
                assert action.help == (argparse.SUPPRESS if flag.hidden else flag.help)
    helped = parser.format_help()
    assert {f for f in CONTRACT_FLAGS if f in helped} == CONTRACT_FLAGS
    defaults = configs_from_args(parser.parse_args([]))
    assert defaults[1:] == (BatchingConfig(), LimitsConfig())
    assert defaults[0] == ModelConfig(preprocess_workers=available_cpus())


def test_the_early_flags_come_from_the_same_declarations():
    from predictor.cli import early_flags

    argv = ["--frontends", "3", "--frontend_parent", "7", "--max_batch_size", "4"]
    early = early_flags(argv)
    assert (early.frontends, early.frontend_parent, early.frontend_index) == ("3", 7, 0)
    assert not hasattr(early, "max_batch_size")
