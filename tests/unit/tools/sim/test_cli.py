"""`epp sim` flags → settings; bad flags are rejected with a clear message."""

from __future__ import annotations

import argparse

import pytest

from epp.tools.sim.cli import configure_parser, parse_lora_module, settings_from_args


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="epp sim")
    configure_parser(parser)
    return parser.parse_args(list(argv))


def test_brief_example_command_line() -> None:
    settings = settings_from_args(
        parse(
            "--host", "127.0.0.2", "--port", "8000", "--pod-name", "pod-a", "--served-model-name", "base",
            "--lora-modules", "a=/x", "b=/y", "--max-loras", "2",
        )
    )  # fmt: skip
    assert (settings.host, settings.port, settings.pod_name) == ("127.0.0.2", 8000, "pod-a")
    assert settings.served_model_names == ("base",)
    assert settings.lora_modules == (("a", "/x"), ("b", "/y"))
    assert (settings.engine.max_loras, settings.engine.max_cpu_loras) == (2, 2)
    assert settings.allow_runtime_lora_updating is True


def test_durations_accept_units_and_seconds() -> None:
    settings = settings_from_args(
        parse("--time-to-first-token", "30ms", "--inter-token-latency", "0.002", "--lora-load-latency", "1s")
    )
    assert settings.engine.cost.time_to_first_token_s == pytest.approx(0.030)
    assert settings.engine.cost.inter_token_latency_s == pytest.approx(0.002)
    assert settings.engine.cost.lora_load_latency_s == pytest.approx(1.0)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a=/models/a", ("a", "/models/a")),
        ("a=/p=q", ("a", "/p=q")),
        ('{"name": "a", "path": "/p", "base_model_name": "base"}', ("a", "/p")),
    ],
    ids=["name-path", "equals-in-path", "json"],
)
def test_lora_module_forms(text: str, expected: tuple[str, str]) -> None:
    assert parse_lora_module(text) == expected


@pytest.mark.parametrize("text", ["a", "=/p", "a=", '{"name": "a"}', "{bad json"], ids=str)
def test_bad_lora_modules_are_rejected(text: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError):
        parse_lora_module(text)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--max-loras", "3", "--max-cpu-loras", "2"], "must be ≥ --max-loras"),
        (["--lora-modules", "a=/x", "a=/y"], "duplicate adapter"),
        (["--lora-modules", "base=/x"], "equals a --served-model-name"),
        (["--kv-cache-tokens", "8", "--block-size", "16"], "at least one block"),
    ],
    ids=["cpu-below-gpu", "duplicate-adapter", "adapter-named-like-base", "kv-below-a-block"],
)
def test_inconsistent_flags_are_rejected(argv: list[str], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        settings_from_args(parse(*argv))


@pytest.mark.parametrize(
    "argv",
    [
        ["--max-loras", "0"],
        ["--lora-load-latency", "-1"],
        ["--itl-batch-factor", "-0.5"],
        ["--enable-lora=maybe"],
    ],
    ids=["zero-slots", "negative-latency", "negative-factor", "bad-bool"],
)
def test_invalid_values_fail_parsing(argv: list[str]) -> None:
    with pytest.raises(SystemExit):
        parse(*argv)


def test_disabling_lora_drops_static_modules() -> None:
    settings = settings_from_args(parse("--enable-lora=false", "--lora-modules", "a=/x"))
    assert settings.enable_lora is False and settings.lora_modules == ()
