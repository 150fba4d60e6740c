"""cloudpickle's own test suite, its round trips sent through sojourn (see harness.py).

Every object the suite round-trips is captured here, restored and captured again in one
fresh interpreter per Python version (3.11, 3.12, 3.13: ``make crossvenvs``; a version
without its venv skips, saying so), and handed back to the test, whose assertions judge it.
``table.py`` says what each test of the suite must do; a test it does not know fails.
cloudpickle's tests are run from its sdist (``tests/thirdparty.py``; licence: its ``LICENSE``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conformance import harness

pytestmark = pytest.mark.slow  # about 30 s on one idle core: three interpreters, four runs of the suite


@pytest.fixture(scope="module")
def conformance(tmp_path_factory: pytest.TempPathFactory) -> harness.Run:
    from tests.thirdparty import fetch

    cp_root = fetch(harness.SOURCE)
    versions = [v for v in harness.VERSIONS if harness.venv_python(v) is not None]
    return harness.run(cp_root, Path(tmp_path_factory.mktemp("conformance")), versions)


def test_every_test_of_the_suite_is_in_the_table_and_does_what_it_says_here(conformance: harness.Run) -> None:
    assert len(conformance.collected) > 200  # the suite was really collected (both protocol classes)
    wrong = [w for w in harness.check(conformance) if "[through " not in w]
    assert not wrong, "\n".join(wrong)


@pytest.mark.parametrize("version", harness.VERSIONS)
def test_round_trips_through_a_fresh_interpreter_of(version: str, conformance: harness.Run) -> None:
    if harness.venv_python(version) is None:
        pytest.skip(f"no .venv{version} (make crossvenvs creates it where Python {version} is installed)")
    assert version not in conformance.echo_errors, conformance.echo_errors[version]
    wrong = [w for w in harness.check(conformance) if f"[through {version}]" in w]
    assert not wrong, "\n".join(wrong)
    c = harness.counts(conformance)[version]
    assert c["passed"] + c["library missing there"] == c["of"]
