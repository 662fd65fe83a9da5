"""scripts/ray_corpus.py names what a failed script raised, not the shutdown line after it."""

from __future__ import annotations

from scripts.ray_corpus import failure_line, rewrite


def test_the_raised_line_wins_over_messages_printed_after_the_traceback() -> None:
    out = (
        "(fleetpulse serve) deploying application 'default' ...\n"
        "Traceback (most recent call last):\n"
        '  File "x.py", line 3, in <module>\n'
        "    assert chunks == expected\n"
        "AssertionError\n"
        "(fleetpulse serve) stopping the local system ...\n"
    )
    assert failure_line(out) == "AssertionError"
    assert failure_line("shared.errors.UsageError: cannot encode args message: x\nbye\n") == (
        "shared.errors.UsageError: cannot encode args message: x"
    )


def test_without_a_raised_line_the_last_line_is_kept() -> None:
    assert failure_line("one\ntwo\n\n") == "two"
    assert failure_line("") == ""


def test_only_ray_import_lines_change() -> None:
    text, changed = rewrite(
        "import ray\nfrom ray import serve\nfrom ray.serve.handle import H\nx = 1\n"
    )
    assert changed == 3
    assert "from fleetpulse import serve" in text and "from fleetpulse.serve import H" in text
    assert text.endswith("x = 1\n")
