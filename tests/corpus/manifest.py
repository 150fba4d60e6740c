"""The corpus: which file of which pinned archive each program is, how it is started, what
replaces its data loading, and which of its output lines are timings.

Nothing of the programs is here: ``files`` names paths inside the archives that
``tests/thirdparty.py`` pins by sha256. ``replace`` edits are (file, text, replacement) and
must match exactly once; each says why in ``note``. Problem sizes are chosen so that each
unmoved run takes a few seconds on one core.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from tests.corpus import synthetic


@dataclass(frozen=True)
class Program:
    name: str
    kind: str  # pure-python | numpy | pandas | scikit-learn | torch (the library it exercises most)
    source: str  # a pin of tests/thirdparty.py
    files: dict[str, str]  # workspace path -> path in the unpacked archive
    entry: str  # the script `sojourn run` starts (a file above, or the harness's driver)
    args: tuple[str, ...] = ()
    libs: tuple[str, ...] = ()  # what must import on an interpreter for the program to run there
    standins: tuple[str, ...] = ()  # harness files copied beside the program (tests/corpus/standins)
    lib_standins: tuple[str, ...] = ()  # harness files on PYTHONPATH outside the workspace
    replace: tuple[tuple[str, str, str], ...] = ()
    driver: str = ""  # the entry script's text when the harness writes it
    data: Callable[[Path], None] | None = None  # writes local synthetic data into the workspace
    filters: tuple[str, ...] = ()  # regexes of stdout lines that are timings
    outputs: tuple[str, ...] = ()  # files the program writes, compared by hash
    timeout: float = 120.0  # the unmoved run's limit
    deadline: float = 60.0  # seconds a pause may wait for a statement boundary
    note: str = ""
    xfail: str = ""  # a finding's reference (docs/corpus.md) while it is open


# Open findings (docs/corpus.md lists every finding and its state): a failure whose
# text matches one is that finding, and the test is an expected failure naming it; the bench
# table counts it as a failure all the same. A failure that matches none is a new finding.
FINDINGS: dict[str, str] = {
    "C5/C7": r"fingerprint mismatch after restore for ('<process>'|the paused program's|module '|the process state)",
}

PYPERF = "pyperformance-1.14.0"
BM = "pyperformance/data-files/benchmarks"


def _bm(name: str, args: tuple[str, ...], note: str = "", **kw: object) -> Program:
    return Program(
        name=f"pyperformance/{name}", kind="pure-python", source=PYPERF,
        files={f"bm_{name}.py": f"{BM}/bm_{name}/run_benchmark.py"}, entry=f"bm_{name}.py", args=args,
        standins=("pyperf.py",),
        note=("pyperf's Runner is replaced by tests/corpus/standins/pyperf.py, which calls the benchmark "
              "function in-process --loops times and prints its result and --check values. " + note).strip(),
        **kw,  # type: ignore[arg-type]
    )


# Sizes: about 3 s of CPU each. A request takes a few hundred ms to reach the session (the
# `sojourn suspend` command starts an interpreter); at ~1 s, a pause asked for in a program's
# last half often came after its end ("missed").
PROGRAMS: list[Program] = [
    _bm("nbody", ("--loops", "42", "--iterations", "20000", "--check", "report_energy()", "--check", "SYSTEM[1]"),
        "Its module-level functions take globals as default arguments (def advance(dt, n, bodies=SYSTEM, ...))."),
    _bm("richards", ("--loops", "72", "--check", "(taskWorkArea.holdCount, taskWorkArea.qpktCount)")),
    _bm("deltablue", ("--loops", "720", "--check", "planner.current_mark")),
    _bm("go", ("--loops", "24",), "versus_cpu() seeds random itself (random.seed(1))."),
    _bm("raytrace", ("--loops", "12", "--filename", "raytrace.ppm"), "The picture it writes is compared.",
        outputs=("raytrace.ppm",)),
    _bm("hexiom", ("--loops", "360", "--level", "25"), "It checks its own solution against the expected one."),
    _bm("chaos", ("--loops", "1", "--iterations", "180000", "--filename", "chaos.ppm"),
        "It seeds random itself (--rng-seed, default 1234); the picture it writes is compared.",
        outputs=("chaos.ppm",)),
]


NUMPY = "numpy-2.5.5"
NB = "benchmarks/benchmarks"
PROGRAMS += [
    Program(
        name="numpy/bench_ufunc_strides.LogisticRegression", kind="numpy", source=NUMPY,
        files={f"benchmarks/{f}.py": f"{NB}/{f}.py" for f in ("__init__", "common", "bench_ufunc_strides")},
        entry="asv_run.py", args=("benchmarks.bench_ufunc_strides", "LogisticRegression", "time_train"),
        libs=("numpy",), standins=("asv_run.py",),
        filters=(r"NumPy CPU features",),
        note="numpy's own asv benchmark (gradient descent on a logistic regression, float32 and float64); "
             "asv is replaced by tests/corpus/standins/asv_run.py, which runs setup() and the timed method "
             "as asv does and prints a digest of the instance's arrays. The benchmarks package prints the "
             "machine's CPU features on import (not the program's result: filtered).",
    ),
]

SKLEARN = "scikit-learn-1.9.1"
PROGRAMS += [
    Program(
        name="scikit-learn/plot_column_transformer_mixed_types", kind="pandas", source=SKLEARN,
        files={"plot_column_transformer_mixed_types.py": "examples/compose/plot_column_transformer_mixed_types.py"},
        entry="plot_column_transformer_mixed_types.py", libs=("sklearn", "pandas"), standins=("corpus_data.py",),
        replace=(("plot_column_transformer_mixed_types.py",
                  'X, y = fetch_openml("titanic", version=1, as_frame=True, return_X_y=True)',
                  "import corpus_data; X, y = corpus_data.titanic()"),),
        note="fetch_openml('titanic') is replaced by a synthetic frame with the same columns and dtypes "
             "(tests/corpus/standins/corpus_data.py).",
        timeout=300,
    ),
    Program(
        name="scikit-learn/plot_lasso_dense_vs_sparse_data", kind="scikit-learn", source=SKLEARN,
        files={"plot_lasso_dense_vs_sparse_data.py": "examples/linear_model/plot_lasso_dense_vs_sparse_data.py"},
        entry="plot_lasso_dense_vs_sparse_data.py", libs=("sklearn", "scipy"),
        filters=(r"^(Sparse|Dense) Lasso done in ",),
        note="Synthetic data of its own (make_regression); dense numpy and scipy.sparse matrices. "
             "Its four 'Lasso done in N s' lines are timings (filtered).",
        timeout=300,
    ),
    Program(
        name="scikit-learn/plot_metadata_routing", kind="scikit-learn", source=SKLEARN,
        files={"plot_metadata_routing.py": "examples/miscellaneous/plot_metadata_routing.py"},
        entry="plot_metadata_routing.py", libs=("sklearn",),
        note="Its own data (numpy's default_rng(42)); many estimator classes defined in the script.",
        timeout=300,
    ),
]

LLMS = "llms-from-scratch-1.0.19"
LP = "pkg/llms_from_scratch"
_LLMS_PKG = {f"llms_from_scratch/{f}.py": f"{LP}/{f}.py"
             for f in ("__init__", "ch02", "ch03", "ch04", "ch05", "ch06", "appendix_d")}


def _llms_test(test: str, func: str, calls: list[str], replace: tuple[tuple[str, str, str], ...], data: object,
               note: str, libs: tuple[str, ...] = ("torch", "matplotlib", "tqdm", "pytest")) -> Program:
    driver = (f"# The harness's driver: calls the test function as pytest would, tmp_path = ./data\n"
              f"from pathlib import Path\nimport {test}\n")
    for c in calls:
        driver += f"print('== {func}[{c or 'default'}]', flush=True)\n{test}.{func}(Path('data'){', ' + c if c else ''})\n"
    return Program(
        name=f"llms-from-scratch/{test}", kind="torch", source=LLMS,
        files={**_LLMS_PKG, f"{test}.py": f"{LP}/tests/{test}.py"}, entry=f"run_{test}.py", driver=driver,
        libs=libs, lib_standins=("tiktoken.py",), replace=replace, data=data,  # type: ignore[arg-type]
        note=("The book's code (the llms_from_scratch package) and one of its tests, run by a driver that "
              "calls the test function. tiktoken's downloaded GPT-2 vocabulary is replaced by a byte-level "
              "stand-in (tests/corpus/standins/tiktoken.py) and the downloaded text by synthetic text; the "
              "asserts on the first losses (values of the real text) print those losses instead. " + note),
        timeout=600, deadline=120,
    )


def _sizes(test: str, indent: str, pairs: list[tuple[str, str]]) -> tuple[tuple[str, str, str], ...]:
    return tuple((f"{test}.py", f"{indent}{old}", f"{indent}{new}") for old, new in pairs)


_LOSS_PRINTS = [
    ("assert round(train_losses[0], 1) == {a}", "print('train_losses', [round(x, 4) for x in train_losses])"),
    ("assert round(val_losses[0], 1) == {b}", "print('val_losses', [round(x, 4) for x in val_losses])"),
]


def _losses(test: str, a: str, b: str) -> tuple[tuple[str, str, str], ...]:
    return tuple((f"{test}.py", f"    {old.format(a=a, b=b)}", f"    {new}") for old, new in _LOSS_PRINTS)


PROGRAMS += [
    _llms_test(
        "test_ch05", "test_train_simple", ["GPTModel"],
        _sizes("test_ch05", "    ", [('"context_length": 256,', '"context_length": 64,'),
                                      ('"emb_dim": 768,', '"emb_dim": 64,'),
                                      ('"n_heads": 12,', '"n_heads": 4,'),
                                      ('"n_layers": 12,', '"n_layers": 2,'),
                                      ('"num_epochs": 2,', '"num_epochs": 6,')])
        + _losses("test_ch05", "7.6", "10.1")
        + (("run_test_ch05.py", "import test_ch05\n",
            "import test_ch05\nfrom llms_from_scratch.ch04 import GPTModel\n"),),
        synthetic.the_verdict,
        "Sizes: a 2-layer, 64-wide GPT on 64-token contexts for 6 epochs (the test's is GPT-2 124M, 2 epochs); "
        "the GPTModel case of its parametrization.",
    ),
    _llms_test(
        "test_appendix_d", "test_train", [""],
        _sizes("test_appendix_d", "        ", [('"context_length": 256,', '"context_length": 64,'),
                                              ('"emb_dim": 768,', '"emb_dim": 64,'),
                                              ('"n_heads": 12,', '"n_heads": 4,'),
                                              ('"n_layers": 12,', '"n_layers": 2,')])
        + _losses("test_appendix_d", "10.9", "11.0"),
        synthetic.the_verdict,
        "Training with linear warm-up, cosine decay and gradient clipping (appendix D). Sizes: a 2-layer, "
        "64-wide GPT on 64-token contexts (the test's is GPT-2 124M).",
    ),
    _llms_test(
        "test_ch06", "test_train_classifier", [""],
        _losses("test_ch06", "0.8", "0.8"),
        synthetic.sms_spam,
        "Fine-tuning a small GPT as a spam classifier on a pandas-prepared, balanced split (chapter 6); "
        "the UCI download is replaced by synthetic messages.",
        libs=("torch", "pandas", "matplotlib", "tqdm", "pytest"),
    ),
]
