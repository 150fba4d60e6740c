"""Writers of the local synthetic data that replaces corpus programs' downloads (harness
code): each puts, where the program looks first, a file its own loading code then reads."""

from __future__ import annotations

import importlib.util
from pathlib import Path

_spec = importlib.util.spec_from_file_location("corpus_data", Path(__file__).parent / "standins" / "corpus_data.py")
assert _spec is not None and _spec.loader is not None
corpus_data = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(corpus_data)


def the_verdict(work: Path) -> None:
    """llms_from_scratch's tests download "the-verdict.txt" unless it is in their tmp_path."""
    d = work / "data"
    d.mkdir(exist_ok=True)
    (d / "the-verdict.txt").write_text(corpus_data.story(20000), encoding="utf-8")


def sms_spam(work: Path) -> None:
    """test_ch06 downloads the UCI SMS spam collection unless its .tsv is there."""
    d = work / "data" / "sms_spam_collection"
    d.mkdir(parents=True, exist_ok=True)
    (d / "SMSSpamCollection.tsv").write_text(corpus_data.sms_spam(), encoding="utf-8")
