"""torch in capsules: captured in one interpreter, restored in a fresh one.

Every round trip checks values (bytes, via SHA-256) and identity: views and shared storages,
parameters shared by a model and its optimizer, schedulers attached to that optimizer.
Restore itself re-pickles what it rebuilt and refuses on any fingerprint difference, so each
successful restore below is also a fixpoint check; several tests run ``sojourn.verify`` too.
"""

from __future__ import annotations

import ctypes
import textwrap
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import last_json, run_py

torch = pytest.importorskip("torch")

PRELUDE = """
import sys, json, hashlib, ctypes, warnings
warnings.simplefilter("ignore")
import sojourn
def digest(t):
    c = t.detach().contiguous()
    n = c.numel() * c.element_size()
    return hashlib.sha256(ctypes.string_at(c.data_ptr(), n)).hexdigest()[:16] if n else "empty"
"""


def capture(tmp_path: Path, repo: str, setup: str, after: str = "") -> tuple[str, Any]:
    """Run ``setup``, capture its globals, then run ``after`` (which may print JSON)."""
    code = PRELUDE + textwrap.dedent(setup) + "\nref = sojourn.capture(globals(), sys.argv[1])\nprint('CAPSULE', ref.id)\n"
    proc = run_py(code + textwrap.dedent(after), repo, cwd=tmp_path)
    capsule = next(ln.split()[1] for ln in proc.stdout.splitlines() if ln.startswith("CAPSULE "))
    report = last_json(proc) if after else None
    return capsule, report


def restore(tmp_path: Path, repo: str, capsule: str, checks: str, policy: str = "auto") -> dict[str, Any]:
    code = (
        PRELUDE
        + f"ns = sojourn.restore(sys.argv[2], sys.argv[1], into=globals(), device_policy={policy!r})\n"
        + "import torch\nout = {'notes': ns.notes}\n"
        + textwrap.dedent(checks)
        + "\nprint(json.dumps(out))\n"
    )
    return last_json(run_py(code, repo, capsule, cwd=tmp_path))  # type: ignore[return-value]


def verify(tmp_path: Path, repo: str, capsule: str) -> None:
    proc = run_py("import sys, sojourn\nr = sojourn.verify(sys.argv[2], sys.argv[1])\nprint(r.ok, r.error)\n", repo, capsule, cwd=tmp_path)
    assert proc.stdout.split()[0] == "True", proc.stdout


# -- tensors -------------------------------------------------------------------------------------

DTYPES = [
    "float32", "float64", "float16", "bfloat16", "bool", "complex64", "complex128", "int8", "uint8",
    "int16", "int32", "int64", "uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2",
]


def test_every_common_dtype_comes_back_bit_for_bit(tmp_path: Path, repo: str) -> None:
    capsule, expected = capture(
        tmp_path,
        repo,
        f"""
        import torch
        g = torch.Generator().manual_seed(0)
        tensors = {{}}
        for name in {DTYPES!r}:
            dt = getattr(torch, name)
            base = torch.randn(4, 5, generator=g) * 50
            if name == "bool":
                t = base > 0
            elif dt.is_complex:
                t = torch.complex(base, -base).to(dt)
            else:
                t = (base.abs() if name.startswith("uint") else base).to(dt)
            tensors[name] = t
        scalar = torch.tensor(3.5, dtype=torch.float64)
        """,
        """
        print(json.dumps({n: [str(t.dtype), list(t.shape), list(t.stride()), digest(t)] for n, t in tensors.items()}))
        """,
    )
    out = restore(
        tmp_path,
        repo,
        capsule,
        """
        out["tensors"] = {n: [str(t.dtype), list(t.shape), list(t.stride()), digest(t)] for n, t in tensors.items()}
        out["devices"] = sorted({t.device.type for t in tensors.values()})
        out["scalar"] = [scalar.item(), list(scalar.shape)]
        """,
    )
    assert out["tensors"] == expected
    assert out["devices"] == ["cpu"]
    assert out["scalar"] == [3.5, []]
    verify(tmp_path, repo, capsule)


def test_views_and_shared_storages_stay_shared(tmp_path: Path, repo: str) -> None:
    capsule, expected = capture(
        tmp_path,
        repo,
        """
        import torch
        a = torch.arange(20, dtype=torch.float32)
        b = a[2:5]
        strided = a.view(4, 5)[:, 1::2]
        transposed = a.view(4, 5).t()
        expanded = torch.ones(3).expand(4, 3)
        permuted = torch.arange(24.).reshape(2, 3, 4).permute(2, 0, 1)
        other = torch.empty(0).set_(a.untyped_storage(), 10, (5,), (1,))  # not a view, same storage
        pair = {"x": b, "same": b}
        """,
        """
        ts = {"a": a, "b": b, "strided": strided, "transposed": transposed, "expanded": expanded, "permuted": permuted}
        print(json.dumps({n: [list(t.stride()), t.storage_offset(), t.is_contiguous(), digest(t)] for n, t in ts.items()}))
        """,
    )
    out = restore(
        tmp_path,
        repo,
        capsule,
        """
        ts = {"a": a, "b": b, "strided": strided, "transposed": transposed, "expanded": expanded, "permuted": permuted}
        out["layout"] = {n: [list(t.stride()), t.storage_offset(), t.is_contiguous(), digest(t)] for n, t in ts.items()}
        base = a.untyped_storage().data_ptr()
        out["one_storage"] = all(t.untyped_storage().data_ptr() == base for t in (b, strided, transposed, other))
        a[3] = -7.0
        a[12] = -9.0
        out["b_sees_a"] = b[1].item()
        out["other_sees_a"] = other[2].item()
        out["transposed_sees_a"] = transposed[2, 2].item()
        out["pair_is_b"] = pair["x"] is b and pair["same"] is b
        """,
    )
    assert out["layout"] == expected
    assert out["one_storage"] is True
    assert out["b_sees_a"] == -7.0 and out["other_sees_a"] == -9.0 and out["transposed_sees_a"] == -9.0
    assert out["pair_is_b"] is True


def test_restored_objects_capture_again_to_the_same_fingerprints(tmp_path: Path, repo: str) -> None:
    capsule, _ = capture(
        tmp_path,
        repo,
        """
        import torch, numpy as np
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
        opt = torch.optim.Adam(model.parameters(), lr=0.01)
        model(torch.randn(5, 3)).sum().backward()
        opt.step()
        view = model[0].weight.detach()[1:]
        arr = np.arange(4.0)
        shared = torch.from_numpy(arr)
        """,
    )
    out = restore(
        tmp_path,
        repo,
        capsule,
        """
        before = {v.name: v.fingerprint for v in ns.manifest.variables if v.name != "<process>"}
        del ns  # the rest of this script's globals come after the restored ones
        again = sojourn.capture(globals(), sys.argv[1])
        out["same"] = {v.name: v.fingerprint == before[v.name] for v in again.variables if v.name in before}
        """,
    )
    assert out["same"] and all(out["same"].values()), [n for n, ok in out["same"].items() if not ok]


def test_from_numpy_tensors_keep_sharing_the_captured_array(tmp_path: Path, repo: str) -> None:
    capsule, _ = capture(
        tmp_path,
        repo,
        """
        import torch, numpy as np
        arr = np.arange(6.0)
        whole = torch.from_numpy(arr)
        tail = torch.from_numpy(arr[2:])
        grid = np.asfortranarray(np.arange(12, dtype=np.int32).reshape(3, 4))
        holder = {"t": torch.from_numpy(grid)}
        orphan = torch.from_numpy(np.full(3, 4.0))  # its array is not captured: a copy travels
        """,
    )
    out = restore(
        tmp_path,
        repo,
        capsule,
        """
        arr[0] = 99.0
        arr[3] = 42.0
        out["whole_sees"] = whole[0].item()
        out["tail_sees"] = tail[1].item()
        out["tail_offset"] = tail.data_ptr() - whole.data_ptr()
        grid[1, 2] = -5
        out["grid_sees"] = holder["t"][1, 2].item()
        out["grid_strides"] = list(holder["t"].stride())
        out["orphan"] = orphan.tolist()
        """,
    )
    assert out["whole_sees"] == 99.0 and out["tail_sees"] == 42.0 and out["tail_offset"] == 16
    assert out["grid_sees"] == -5 and out["grid_strides"] == [1, 3]
    assert out["orphan"] == [4.0, 4.0, 4.0]
    verify(tmp_path, repo, capsule)


def test_sparse_quantized_meta_and_conjugate_views(tmp_path: Path, repo: str) -> None:
    capsule, expected = capture(
        tmp_path,
        repo,
        """
        import torch
        g = torch.Generator().manual_seed(2)
        dense = torch.randn(4, 5, generator=g) * (torch.rand(4, 5, generator=g) > 0.6)
        coo = dense.to_sparse()
        uncoalesced = torch.sparse_coo_tensor(torch.tensor([[0, 0, 1], [1, 1, 2]]), torch.tensor([1.0, 2.0, 3.0]), (2, 3))
        csr = dense.to_sparse_csr()
        csc = dense.to_sparse_csc()
        qt = torch.quantize_per_tensor(torch.randn(6, generator=g), 0.05, 3, torch.qint8)
        qc = torch.quantize_per_channel(torch.randn(2, 3, generator=g), torch.tensor([0.1, 0.2]), torch.tensor([0, 1]), 0, torch.quint8)
        meta = torch.empty(6, 2, device="meta")
        meta_view = meta[2:]
        z = torch.randn(4, dtype=torch.complex64, generator=g)
        zc = z.conj()
        neg = torch.randn(3, dtype=torch.complex64, generator=g).conj().imag  # a neg-bit view
        """,
        """
        print(json.dumps({
            "coo": dense.tolist(), "coalesced": [coo.is_coalesced(), uncoalesced.is_coalesced()],
            "unc": uncoalesced.to_dense().tolist(), "qt": qt.int_repr().tolist(), "qc": qc.int_repr().tolist(),
            "zc": [digest(zc.resolve_conj())], "neg": neg.tolist(),
        }))
        """,
    )
    out = restore(
        tmp_path,
        repo,
        capsule,
        """
        out["coo"] = coo.to_dense().tolist()
        out["csr"] = csr.to_dense().tolist() == out["coo"] and csr.layout == torch.sparse_csr
        out["csc"] = csc.to_dense().tolist() == out["coo"] and csc.layout == torch.sparse_csc
        out["coalesced"] = [coo.is_coalesced(), uncoalesced.is_coalesced()]
        out["unc"] = uncoalesced.to_dense().tolist()
        out["qt"] = qt.int_repr().tolist()
        out["qt_params"] = [qt.q_scale(), qt.q_zero_point()]
        out["qc"] = qc.int_repr().tolist()
        out["qc_params"] = [qc.q_per_channel_scales().tolist(), qc.q_per_channel_zero_points().tolist(), qc.q_per_channel_axis()]
        out["meta"] = [str(meta.device), list(meta_view.shape), meta_view.untyped_storage().nbytes()]
        out["zc"] = [zc.is_conj(), zc.data_ptr() == z.data_ptr(), digest(zc.resolve_conj())]
        out["neg"] = [neg.is_neg(), neg.tolist()]
        """,
    )
    assert out["coo"] == expected["coo"] and out["csr"] and out["csc"]
    assert out["coalesced"] == expected["coalesced"] and out["unc"] == expected["unc"]
    assert out["qt"] == expected["qt"] and out["qc"] == expected["qc"]
    assert out["qt_params"] == [0.05, 3]
    assert out["qc_params"][1:] == [[0, 1], 0]
    assert out["meta"] == ["meta", [4, 2], 48]
    assert out["zc"] == [True, True, expected["zc"][0]]
    assert out["neg"] == [True, expected["neg"]]
    verify(tmp_path, repo, capsule)


def test_requires_grad_grad_and_tensor_hooks(tmp_path: Path, repo: str) -> None:
    capsule, _ = capture(
        tmp_path,
        repo,
        """
        import torch
        w = torch.nn.Parameter(torch.ones(3, 2))
        frozen = torch.nn.Parameter(torch.zeros(2), requires_grad=False)
        x = torch.ones(3, requires_grad=True)
        def tenfold(grad):
            return grad * 10
        x.register_hook(tenfold)
        (w.sum() * 2 + x.sum()).backward()
        w.note = "kept"  # a Python attribute on a tensor
        class Tagged(torch.Tensor):  # a user subclass, defined in __main__: travels as source
            pass
        tagged = torch.arange(3.0).as_subclass(Tagged)
        tagged.tag = "t"
        tagged_view = tagged[1:]
        """,
    )
    out = restore(
        tmp_path,
        repo,
        capsule,
        """
        out["types"] = [type(w).__name__, type(frozen).__name__, type(x).__name__]
        out["requires_grad"] = [w.requires_grad, frozen.requires_grad, x.requires_grad]
        out["leaf"] = [w.is_leaf, x.is_leaf]
        out["grads"] = [w.grad.tolist(), x.grad.tolist(), frozen.grad]
        out["grad_own_storage"] = w.grad.data_ptr() != w.data_ptr()
        out["note"] = w.note
        out["tagged"] = [type(tagged).__name__, isinstance(tagged, Tagged), tagged.tag, tagged.tolist(),
                         tagged_view.data_ptr() == tagged.data_ptr() + 4]
        x.grad = None
        (x * 1).sum().backward()
        out["hook_after_restore"] = x.grad.tolist()
        """,
    )
    assert out["types"] == ["Parameter", "Parameter", "Tensor"]
    assert out["requires_grad"] == [True, False, True] and out["leaf"] == [True, True]
    assert out["grads"] == [[[2.0, 2.0]] * 3, [10.0] * 3, None]
    assert out["grad_own_storage"] is True and out["note"] == "kept"
    assert out["tagged"] == ["Tagged", True, "t", [0.0, 1.0, 2.0], True]
    assert out["hook_after_restore"] == [10.0] * 3


def test_graph_tensors_and_unsupported_tensors_are_refused_with_reasons(tmp_path: Path, repo: str) -> None:
    proc = run_py(
        PRELUDE
        + textwrap.dedent(
            """
            import torch
            x = torch.randn(3, requires_grad=True)
            y = x * 2
            holder = {"out": y[1:]}
            nested = torch.nested.nested_tensor([torch.ones(2), torch.ones(3)])
            lazy = torch.nn.LazyLinear(4)
            try:
                sojourn.capture(globals(), sys.argv[1])
            except sojourn.CaptureError as e:
                print(json.dumps({"msg": str(e)}))
            """
        ),
        repo,
        cwd=tmp_path,
    )
    msg = last_json(proc)["msg"]  # type: ignore[index]
    assert "nothing was written" in msg
    assert "grad_fn=MulBackward0" in msg and "detach()" in msg and "after backward()" in msg
    assert "grad_fn=SliceBackward0" in msg and "holder" in msg
    assert "nested tensors are not supported" in msg
    assert "lazy module" in msg and "forward pass" in msg


# -- models, optimizers, schedulers ----------------------------------------------------------------

MODEL = """
import torch
class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(4, 8)
        self.fc2 = torch.nn.Linear(8, 2)
        self.register_buffer("running", torch.zeros(8))
        self.register_buffer("scratch", torch.ones(2), persistent=False)
    def forward(self, x):
        h = torch.relu(self.fc1(x))
        self.running += h.detach().mean(0)
        return self.fc2(h)
"""


def test_model_optimizers_and_schedulers_keep_their_identities(tmp_path: Path, repo: str) -> None:
    capsule, expected = capture(
        tmp_path,
        repo,
        MODEL
        + textwrap.dedent(
            """
        torch.manual_seed(0)
        model = Net()
        calls = []
        handle = model.fc1.register_forward_hook(lambda m, i, o: calls.append("old"))
        model.fc2.register_forward_hook(lambda m, i, o: calls.append("fc2"))  # its handle is dropped
        steps = []
        params = list(model.parameters())
        opts = {
            "sgd": torch.optim.SGD(params, lr=0.1, momentum=0.9),
            "adam": torch.optim.Adam(params, lr=0.01),
            "adamw": torch.optim.AdamW(params, lr=0.01, weight_decay=0.1),
        }
        opts["adam"].register_step_post_hook(lambda opt, args, kwargs: steps.append("adam"))
        scheds = {
            "sgd": torch.optim.lr_scheduler.StepLR(opts["sgd"], step_size=2, gamma=0.5),
            "adam": torch.optim.lr_scheduler.CosineAnnealingLR(opts["adam"], T_max=10),
            "adamw": torch.optim.lr_scheduler.LambdaLR(opts["adamw"], lambda epoch: 0.8 ** epoch),
        }
        x = torch.randn(5, 4)
        for _ in range(3):
            for name, opt in opts.items():
                opt.zero_grad()
                model(x).pow(2).mean().backward()
                opt.step()
                scheds[name].step()
        """
        ),
        """
        for name, opt in opts.items():
            opt.step(); scheds[name].step()
        print(json.dumps({n: s.get_last_lr() for n, s in scheds.items()}))
        """,
    )
    out = restore(
        tmp_path,
        repo,
        capsule,
        """
        params = list(model.parameters())
        out["param_type"] = all(type(p) is torch.nn.Parameter for p in params)
        out["opt_weight_is"] = opts["sgd"].param_groups[0]["params"][0] is model.fc1.weight
        for name, opt in opts.items():
            out[name] = {
                "params_are_the_model's": all(a is b for a, b in zip(opt.param_groups[0]["params"], params, strict=True)),
                "state_keyed_by_them": len(opt.state) == len(params) and all(any(k is p for p in params) for k in opt.state),
                "scheduler_attached": scheds[name].optimizer is opt,
            }
        out["momentum"] = "momentum_buffer" in opts["sgd"].state[model.fc1.weight]
        out["buffers"] = sorted(dict(model.named_buffers()))
        out["state_dict_keys"] = sorted(model.state_dict())
        model(torch.ones(1, 4))
        out["old_hooks"] = calls[-2:]
        # Restored hook ids are taken: new hooks must not replace them in their dicts.
        model.fc2.register_forward_hook(lambda m, i, o: calls.append("fc2-new"))
        model.fc1.register_forward_hook(lambda m, i, o: calls.append("new"))
        model(torch.ones(1, 4))
        out["all_hooks"] = calls[-4:]
        handle.remove()
        model(torch.ones(1, 4))
        out["after_remove"] = calls[-3:]
        for name, opt in opts.items():
            opt.step(); scheds[name].step()
        out["lrs"] = {n: s.get_last_lr() for n, s in scheds.items()}
        out["optimizer_hook"] = steps.count("adam")
        """,
    )
    assert out["param_type"] is True and out["opt_weight_is"] is True
    for name in ("sgd", "adam", "adamw"):
        assert all(out[name].values()), (name, out[name])
    assert out["momentum"] is True
    assert out["buffers"] == ["running", "scratch"]
    assert "scratch" not in out["state_dict_keys"] and "running" in out["state_dict_keys"]
    assert out["old_hooks"] == ["old", "fc2"]
    assert out["all_hooks"] == ["old", "new", "fc2", "fc2-new"]
    assert out["after_remove"] == ["new", "fc2", "fc2-new"]
    assert out["lrs"] == expected
    assert out["optimizer_hook"] == 4  # 3 steps before capture, 1 after
    verify(tmp_path, repo, capsule)


TRAIN = MODEL + """
torch.set_num_threads(1)
torch.manual_seed(0)
model = Net()
model2 = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Dropout(0.2), torch.nn.Linear(6, 2))
opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.01)
opt2 = torch.optim.SGD(model2.parameters(), lr=0.05, momentum=0.9)
sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda step: 0.9 ** step)
sched2 = torch.optim.lr_scheduler.StepLR(opt2, step_size=3, gamma=0.5)
gen = torch.Generator().manual_seed(123)
data = torch.randn(64, 4, generator=gen)
target = data.sum(1, keepdim=True).repeat(1, 2)

def train(n):
    for _ in range(n):
        idx = torch.randint(0, 64, (16,), generator=gen)
        for m, o, s in ((model, opt, sched), (model2, opt2, sched2)):
            loss = torch.nn.functional.mse_loss(m(data[idx]), target[idx])
            o.zero_grad()
            loss.backward()
            o.step()
            s.step()

def report():
    out = {k: digest(v) for k, v in {**model.state_dict(), **{"2." + k: v for k, v in model2.state_dict().items()}}.items()}
    for name, o in (("opt", opt), ("opt2", opt2)):
        for i, st in o.state_dict()["state"].items():
            for k, v in st.items():
                out[f"{name}.{i}.{k}"] = digest(v) if isinstance(v, torch.Tensor) else v
    out["lr"] = [sched.get_last_lr(), sched2.get_last_lr()]
    out["next"] = [digest(torch.rand(4)), digest(torch.rand(4, generator=gen))]
    print(json.dumps(out))
"""


def test_training_continues_bit_for_bit(tmp_path: Path, repo: str) -> None:
    capsule, _ = capture(tmp_path, repo, TRAIN + "\ntrain(5)\n")
    resumed = last_json(
        run_py(
            PRELUDE + "import torch\ntorch.set_num_threads(1)\n"
            "sojourn.restore(sys.argv[2], sys.argv[1], into=globals())\ntrain(5)\nreport()\n",
            repo,
            capsule,
            cwd=tmp_path,
        )
    )
    uninterrupted = last_json(run_py(PRELUDE + TRAIN + "\ntrain(10)\nreport()\n", cwd=tmp_path))
    assert resumed == uninterrupted
    verify(tmp_path, repo, capsule)


def test_generators_and_global_rng_continue(tmp_path: Path, repo: str) -> None:
    capsule, expected = capture(
        tmp_path,
        repo,
        """
        import torch
        torch.manual_seed(5)
        torch.rand(3)
        g = torch.Generator().manual_seed(11)
        torch.randn(7, generator=g)
        same = {"g": g}
        default = torch.default_generator
        """,
        """
        print(json.dumps([torch.rand(3).tolist(), torch.randn(4, generator=g).tolist(), g.initial_seed()]))
        """,
    )
    out = restore(
        tmp_path,
        repo,
        capsule,
        """
        out["draws"] = [torch.rand(3).tolist(), torch.randn(4, generator=g).tolist(), g.initial_seed()]
        out["same"] = same["g"] is g
        out["default"] = default is torch.default_generator
        """,
    )
    assert out["draws"] == expected
    assert out["same"] is True and out["default"] is True


# -- devices -------------------------------------------------------------------------------------

# Makes the capturing process believe some storages live on cuda:0 (their bytes are read from
# the CPU as usual): the only way to put a GPU in a device table on a machine without one.
FAKE_GPU = """
import sojourn.capsule.reducers.torch as torch_reducer
_real_device = torch_reducer._storage_device
ON_GPU = set()
torch_reducer._storage_device = lambda s: "cuda:0" if s.data_ptr() in ON_GPU else _real_device(s)
"""


def test_devices_stay_out_of_the_stream_and_follow_the_policy(tmp_path: Path, repo: str) -> None:
    if torch.cuda.is_available():
        pytest.skip("simulates a capsule from a GPU machine; this machine has CUDA")
    proc = run_py(
        PRELUDE
        + FAKE_GPU
        + textwrap.dedent(
            """
            import torch
            host = torch.arange(6.0)
            gpu = torch.arange(4.0) * 2
            gview = gpu[1:]
            def capture_fps():
                ref = sojourn.capture({"host": host, "gpu": gpu, "gview": gview}, sys.argv[1])
                return ref.id, {v.name: v.fingerprint for v in ref.variables if v.name != "<process>"}
            plain_id, plain = capture_fps()
            ON_GPU.update(t.untyped_storage().data_ptr() for t in (host, gpu))
            all_gpu_id, all_gpu = capture_fps()
            ON_GPU.discard(host.untyped_storage().data_ptr())
            mixed_id, _ = capture_fps()  # host on the CPU, gpu and gview on "cuda:0"
            print(json.dumps({"plain": plain, "all_gpu": all_gpu, "ids": [plain_id, all_gpu_id, mixed_id]}))
            """
        ),
        repo,
        cwd=tmp_path,
    )
    caps = last_json(proc)
    # The stream holds device *indices*: the same tensors on another device, same fingerprints.
    assert caps["plain"] == caps["all_gpu"]  # type: ignore[index]
    plain_id, all_gpu_id, gpu_id = caps["ids"]  # type: ignore[index]
    assert plain_id != all_gpu_id  # the device table differs, and it is in the manifest
    checks = """
        out["devices"] = [str(t.device) for t in (host, gpu, gview)]
        out["values"] = [host.tolist(), gpu.tolist()]
        out["shared"] = gview.untyped_storage().data_ptr() == gpu.untyped_storage().data_ptr()
    """
    auto = restore(tmp_path, repo, gpu_id, checks)
    assert auto["devices"] == ["cpu", "cpu", "cpu"] and auto["shared"] is True
    assert auto["values"] == [[0.0, 1.0, 2.0, 3.0, 4.0, 5.0], [0.0, 2.0, 4.0, 6.0]]
    assert any("cuda:0" in n and "restored on cpu" in n for n in auto["notes"])
    cpu = restore(tmp_path, repo, gpu_id, checks, policy="cpu")
    assert cpu["devices"] == ["cpu", "cpu", "cpu"]
    keep = run_py(
        "import sys, sojourn\nsojourn.restore(sys.argv[2], sys.argv[1], device_policy='keep')\n",
        repo, gpu_id, cwd=tmp_path, check=False,
    )
    assert keep.returncode != 0
    assert "cuda:0" in keep.stderr and "device_policy='keep'" in keep.stderr and "'auto'" in keep.stderr
    verify(tmp_path, repo, gpu_id)


def test_torch_device_values_are_remapped_by_the_same_policy(tmp_path: Path, repo: str) -> None:
    if torch.cuda.is_available():
        pytest.skip("checks the fallback to the CPU; this machine has CUDA")
    capsule, _ = capture(
        tmp_path,
        repo,
        """
        import torch
        gpu, cpu, meta = torch.device("cuda:0"), torch.device("cpu"), torch.device("meta")
        config = {"device": gpu, "again": gpu}
        """,
    )
    out = restore(
        tmp_path,
        repo,
        capsule,
        'out["devices"] = [str(gpu), str(cpu), str(meta)]\nout["same"] = config["device"] is gpu and config["again"] is gpu\n',
    )
    assert out["devices"] == ["cpu", "cpu", "meta"] and out["same"] is True
    assert any("cuda:0" in n for n in out["notes"])
    keep = run_py(
        "import sys, sojourn\nsojourn.restore(sys.argv[2], sys.argv[1], device_policy='keep')\n",
        repo, capsule, cwd=tmp_path, check=False,
    )
    assert keep.returncode != 0 and "no cuda device" in keep.stderr


def test_map_device_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    from sojourn.capsule.reducers.torch import map_device
    from sojourn.errors import RestoreError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    assert map_device("cuda:1", "auto") == "cuda:1"
    assert map_device("cuda:3", "auto") == "cuda:1"  # more GPUs at capture: wrap around
    assert map_device("cuda:1", "cpu") == "cpu"
    assert map_device("meta", "cpu") == "meta"
    assert map_device("cuda:1", "keep") == "cuda:1"
    with pytest.raises(RestoreError, match="has 2 cuda device"):
        map_device("cuda:3", "keep")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert map_device("cuda:0", "auto") == "cpu"
    with pytest.raises(RestoreError, match="device_policy"):
        map_device("cuda:0", "sideways")


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_tensors_round_trip(tmp_path: Path, repo: str) -> None:
    capsule, expected = capture(
        tmp_path,
        repo,
        """
        import torch
        a = torch.arange(10.0, device="cuda")
        b = a[2:5]
        g = torch.Generator(device="cuda").manual_seed(4)
        host = torch.ones(2)
        """,
        'print(json.dumps([a.tolist(), torch.rand(3, device="cuda", generator=g).tolist()]))\n',
    )
    out = restore(
        tmp_path,
        repo,
        capsule,
        """
        out["devices"] = [str(a.device), str(b.device), str(host.device)]
        out["values"] = [a.tolist(), torch.rand(3, device="cuda", generator=g).tolist()]
        out["shared"] = b.data_ptr() == a.data_ptr() + 8
        """,
    )
    assert out["devices"] == ["cuda:0", "cuda:0", "cpu"] and out["shared"] is True
    assert out["values"] == expected
    cpu = restore(tmp_path, repo, capsule, 'out["devices"] = [str(a.device), str(b.device)]', policy="cpu")
    assert cpu["devices"] == ["cpu", "cpu"]
    verify(tmp_path, repo, capsule)


# -- costs and imports -------------------------------------------------------------------------------


def test_cpu_storage_bytes_leave_the_stream_without_a_copy() -> None:
    from sojourn.capsule.capture import pickle_namespace
    from sojourn.capsule.reducers.torch import _allocate_storage

    big = torch.ones(1 << 20)  # 4 MiB
    pickled = pickle_namespace({"big": big, "view": big[10:], "again": big})
    buffers = [b for b in pickled.buffers if b.kind == "torch-storage"]
    assert len(buffers) == 1
    buf = buffers[0]
    assert len(buf.view) == 4 << 20
    assert ctypes.addressof(ctypes.c_char.from_buffer(buf.view)) == big.data_ptr()
    start, end = pickled.segments[0]
    assert end - start < 1024
    storage, view = _allocate_storage({"nbytes": 64}, 64)
    assert len(view) == 64 and ctypes.addressof(ctypes.c_char.from_buffer(view)) == storage.data_ptr()


def test_torch_is_not_imported_for_a_namespace_without_torch(tmp_path: Path, repo: str) -> None:
    proc = run_py(
        PRELUDE
        + "import numpy as np\nx = np.arange(3)\ny = {'a': [1, 2]}\n"
        + "ref = sojourn.capture(globals(), sys.argv[1])\nprint(json.dumps({'id': ref.id, 'torch': 'torch' in sys.modules}))\n",
        repo,
        cwd=tmp_path,
    )
    cap = last_json(proc)
    assert cap["torch"] is False  # type: ignore[index]
    back = run_py(
        "import sys, json, sojourn\nsojourn.restore(sys.argv[2], sys.argv[1])\nprint(json.dumps({'torch': 'torch' in sys.modules}))\n",
        repo,
        cap["id"],  # type: ignore[index]
        cwd=tmp_path,
    )
    assert last_json(back) == {"torch": False}
