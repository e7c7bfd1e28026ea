"""The ``histoserve embed`` command line: flags to config, exit statuses 0/1/2."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

from histoserve.commands.embed import (
    EXIT_FAILED,
    EXIT_USAGE,
    _PrintableFormatter,
    build_parser,
    config_from_args,
    main,
)
from histoserve.commands.main import main as histoserve_main
from histoserve.embedding.pipeline import EmbedSummary, collect_entries
from histoserve.errors import UsageError

URL = ("--url", "http://127.0.0.1:9")  # nothing listens on the discard port


def _config(*argv: str, env: dict[str, str] | None = None):
    return config_from_args(build_parser().parse_args(list(argv)), env or {})


def test_every_flag_reaches_the_config(tmp_path: Path) -> None:
    config = _config(
        "a.svs", "b.tiff", *URL, "--url", "grpc://h:8081", "--out", str(tmp_path),
        "--model", "h0", "--mode", "prediction", "--target-mpp", "0.5", "--tile-size", "224",
        "--mpp-override", "0.25", "--mpp-tolerance", "0.1", "--tissue", "tissue-seg",
        "--tissue-url", "http://seg:80", "--min-tissue", "0.5", "--batch-size", "32",
        "--concurrency", "6", "--read-workers", "3", "--force", "--shard", "1/4",
        "--progress", "bar", "--max-attempts", "5", "--timeout-s", "60",
        "--recycle-requests", "10", "--recycle-s", "5", "--slides-in-flight", "3",
    )  # fmt: skip
    assert config.slides == (Path("a.svs"), Path("b.tiff"))
    assert config.urls == ("http://127.0.0.1:9", "grpc://h:8081")
    assert (config.model, config.mode, config.target_mpp, config.tile_size) == (
        "h0", "prediction", 0.5, 224,
    )  # fmt: skip
    assert (config.mpp_override, config.mpp_tolerance) == (0.25, 0.1)
    assert (config.tissue, config.tissue_urls, config.min_tissue) == (
        "tissue-seg", ("http://seg:80",), 0.5,
    )  # fmt: skip
    assert (config.batch_size, config.concurrency, config.read_workers) == (32, 6, 3)
    assert config.force and config.shard == (1, 4) and config.progress == "bar"
    assert (config.max_attempts, config.timeout_s) == (5, 60.0)
    assert (config.recycle_requests, config.recycle_s) == (10, 5.0)
    assert config.slides_in_flight == 3


def test_shard_count_alone_reads_the_job_index(tmp_path: Path) -> None:
    config = _config("a.svs", *URL, "--out", str(tmp_path), "--shard", "3",
                     env={"JOB_COMPLETION_INDEX": "2"})  # fmt: skip
    assert config.shard == (2, 3)


@pytest.mark.parametrize(
    "argv",
    [
        ["a.svs", *URL],  # no --out
        ["a.svs", "--out", "o"],  # no --url
        ["a.svs", *URL, "--out", "o", "--bogus"],
        ["a.svs", *URL, "--out", "o", "--mode", "logits"],
        ["a.svs", *URL, "--out", "o", "--batch-size", "many"],
    ],
)
def test_argparse_errors_exit_2(argv: list[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == EXIT_USAGE


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        ([*URL, "--out", "{out}"], "no slides given"),
        (["a.svs", *URL, "--out", "{out}", "--shard", "4/4"], "--shard"),
        (["a.svs", *URL, "--out", "{out}", "--batch-size", "0"], "--batch-size"),
        (["--manifest", "{out}/missing.csv", *URL, "--out", "{out}"], "missing.csv"),
        (["{out}/a.svs", *URL, "--out", "{out}/file.txt/out"], "cannot create it"),
    ],
)
def test_usage_errors_exit_2_before_any_call(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    argv = [a.replace("{out}", str(tmp_path)) for a in argv]
    (tmp_path / "file.txt").write_text("a file where a folder should be")
    assert main(argv) == EXIT_USAGE
    assert message in capsys.readouterr().err


def test_unreachable_server_exits_1(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    slide = tmp_path / "a.svs"
    slide.write_bytes(b"not a slide")
    argv = [str(slide), *URL, "--out", str(tmp_path / "out"), "--max-attempts", "2"]
    assert main(argv) == EXIT_FAILED
    err = capsys.readouterr().err
    assert "cannot reach http://127.0.0.1:9 to describe the model" in err
    assert "asking http://127.0.0.1:9 for models failed 2 times" in err
    assert "http://127.0.0.1:9/v1/models: ConnectError" in err


def test_histoserve_dispatches_embed(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        histoserve_main(["embed", "--help"])
    assert info.value.code == 0 and "histoserve embed" in capsys.readouterr().out


def test_shard_and_duplicates(tmp_path: Path) -> None:
    paths = [str(tmp_path / f"s{i}.svs") for i in range(5)]
    picked = collect_entries(_config(*paths, *URL, "--out", str(tmp_path), "--shard", "1/2"))
    assert [e.slide_id for e in picked] == ["s1", "s3"]
    with pytest.raises(UsageError, match="s0"):
        collect_entries(_config(paths[0], str(tmp_path / "other" / "s0.tiff"), *URL, "--out", "o"))


def test_exit_code_follows_failures() -> None:
    assert EmbedSummary(done=["a"], skipped=["b"]).exit_code == 0
    assert EmbedSummary(done=["a"], failed={"c": "no mpp"}).exit_code == 1


def test_control_characters_in_messages_are_shown_escaped(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    manifest = tmp_path / "mis\x1b[2Jsing\u202e.csv"
    assert main(["--manifest", str(manifest), *URL, "--out", str(tmp_path)]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "mis\\x1b[2Jsing\\u202e.csv" in err and "\x1b" not in err and "\u202e" not in err
    with pytest.raises(SystemExit) as info:
        main(["a.svs", *URL, "--out", "o", "--bogus\x1b]0;title\x07"])
    err = capsys.readouterr().err
    assert info.value.code == EXIT_USAGE
    assert "--bogus\\x1b]0;title\\x07" in err and "\x1b" not in err and "\x07" not in err


def test_log_lines_escape_control_characters_and_keep_a_tracebacks_lines() -> None:
    formatter = _PrintableFormatter("%(levelname)s %(name)s: %(message)s")
    try:
        raise ValueError("bad\x1b[2J path\nforged line")
    except ValueError:
        record = logging.LogRecord(
            "embed", logging.WARNING, __file__, 1, "slide %s: %s", ("s\x07", "x\ry"), sys.exc_info()
        )
    text = formatter.format(record)
    first, *rest = text.split("\n")
    assert first == "WARNING embed: slide s\\x07: x\\ry"
    assert rest[0] == "Traceback (most recent call last):" and len(rest) > 2
    assert rest[-2].startswith("    raise ValueError(")  # the traceback's own line breaks stay
    assert rest[-1] == "ValueError: bad\\x1b[2J path\\nforged line"  # the message's do not
    assert not any(c in text for c in "\x1b\x07\r")
