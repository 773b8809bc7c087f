"""The throughput benchmark (``python -m lit_fedco.benchmarks.throughput``): what it writes, its
agreement check, its command line. Nothing here depends on how fast anything runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch

from lit_fedco.benchmarks import throughput as T
from tests.helpers import REPO
from tests.idx_files import make_set, write_idx

KEYS = {"workload", "clients", "impl", "threads", "client_steps_per_s"}


@pytest.fixture
def keep_threads():
    n = torch.get_num_threads()
    yield
    torch.set_num_threads(n)


def test_tiny_run_writes_a_record_per_workload_and_impl(tmp_path, capsys, keep_threads):
    out = tmp_path / "t.json"
    argv = ["--workloads", *T.WORKLOADS, "--clients", "1", "--threads", "1", "--repeat", "2",
            "--min-time", "0", "--check-rounds", "1", "--data-dir", "",
            "--json", str(out)]  # fmt: skip
    returned = T.main(argv)
    records = json.loads(out.read_text())
    assert records == json.loads(json.dumps(returned))
    assert {(r["workload"], r["impl"]) for r in records} == {
        (w, i) for w in T.WORKLOADS for i in T.IMPLS
    }
    assert len(records) == len(T.WORKLOADS) * len(T.IMPLS)
    for r in records:
        assert r.keys() >= KEYS
        assert r["clients"] == 1 and r["threads"] == 1 and r["impl"] in T.IMPLS
        assert r["client_steps_per_s"] > 0 and len(r["client_steps_per_s_runs"]) == 2
        assert r["rounds_timed"] == 2  # --min-time 0: one round a slot
        assert r["peak_mem_mib"] > 0 and r["round_mem_mib"] >= 0
        # the peak above the process before the data were built: a few KiB of logistic
        # regression data can stay within what the process had already touched (0, not < 0);
        # ResNet-20's 0.27M parameters and their state cannot
        assert r["workload_mem_kib_per_client"] >= 0
        assert r["workload_mem_kib_per_client"] > 0 or r["workload"] != "resnet20"
        assert r["data"] in ("digits", "synthetic")  # no Fashion-MNIST folder: digits
        if r["impl"] == "plain":
            assert r["ratio_to_plain"] == 1.0 and r["agrees"] is None
        else:
            assert r["agrees"] is True, r
            assert r["max_rel_diff_to_plain"] <= T.AGREE_TOL
    text = capsys.readouterr().out
    assert "client-steps/s" in text and "agree" in text and "FAIL" not in text


@pytest.mark.slow
def test_devices_mode_with_shard_data_reports_each_process_holding_its_clients_rows(
    tmp_path, capsys, keep_threads
):
    """``--devices 1 2 --shard-data``: one process holds every client's data; each of two holds
    its own clients' rows only, the two adding up to the one (the embedded digits split over
    K = 6 clients)."""
    out = tmp_path / "t.json"
    argv = ["--workloads", "logreg", "--clients", "6", "--threads", "1", "--repeat", "1",
            "--min-time", "0", "--check-rounds", "0", "--data-dir", "", "--devices", "1", "2",
            "--impls", "plain", "vectorized", "--shard-data", "--json", str(out)]  # fmt: skip
    T.main(argv)
    records = {r["processes"]: r for r in json.loads(out.read_text()) if "processes" in r}
    one, two = records[1]["data_mib_per_process"], records[2]["data_mib_per_process"]
    assert records[2]["shard_data"] and len(one) == 1 and len(two) == 2
    assert sum(two) == pytest.approx(one[0], rel=1e-12) and 0 < min(two) < one[0]
    assert "MiB of client data held" in capsys.readouterr().out


@pytest.mark.slow
def test_devices_mode_runs_real_processes_and_reports_their_kept_state(
    tmp_path, capsys, keep_threads
):
    """``--devices 1 2 --updater scaffold``: each executor on one and on two Fabric processes
    (gloo), a record each; with two, each process holds the control variates of half of the
    K = 6 clients (its own), the two halves adding up to the one process's."""
    out = tmp_path / "t.json"
    argv = ["--workloads", "logreg", "--clients", "6", "--threads", "1", "--repeat", "1",
            "--min-time", "0", "--check-rounds", "0", "--data-dir", "", "--devices", "1", "2",
            "--updater", "scaffold", "--json", str(out)]  # fmt: skip
    T.main(argv)
    records = [r for r in json.loads(out.read_text()) if "processes" in r]
    assert {(r["impl"], r["processes"]) for r in records} == {
        (i, n) for i in ("vectorized", "sequential") for n in (1, 2)
    }
    for r in records:
        n = r["processes"]
        assert r["client_steps_per_s"] > 0 and r["threads_per_process"] == 1
        assert r["updater"] == "scaffold" and r["ratio_to_plain"] is None  # not FedAvg's work
        assert len(r["peak_mem_mib_per_process"]) == n and min(r["peak_mem_mib_per_process"]) > 0
        assert r["kept_clients_per_process"] == ([6] if n == 1 else [3, 3])
        one = next(o for o in records if o["impl"] == r["impl"] and o["processes"] == 1)
        kept = r["kept_state_mib_per_process"]
        assert sum(kept) == pytest.approx(one["kept_state_mib_per_process"][0], rel=1e-12)
        assert max(kept) == pytest.approx(sum(kept) / n, rel=1e-12) and kept[0] > 0
    assert "processes (--devices)" in capsys.readouterr().out


def tiny(name: str = "conv", **kw) -> T.Workload:
    (w,) = T.make_workloads([name], [3], quick=True, data_dir="")
    return T.Workload(**{**w.__dict__, **kw})


def test_agreement_check_passes_for_the_same_algorithm_and_fails_for_another_lr():
    w = tiny(cohort=2)  # partial participation: the cohort must be the same one too
    data = T.build_data(w, seed=0)
    diffs = T.agreement(w, data, "cpu", seed=0, rounds=2)
    assert set(diffs) == {"vectorized", "sequential"}
    assert all(d <= T.AGREE_TOL for d in diffs.values()), diffs

    lit = T.make_impl("vectorized", w, data, "cpu", torch.float64, 0)
    off = T.PlainLoop(w, data, "cpu", torch.float64, 0, lr=w.lr * 1.01)
    same = T.PlainLoop(w, data, "cpu", torch.float64, 0)
    for impl in (lit, off, same):
        impl.run_round()
    assert T.models_agree(same.params(), lit.params())[0]
    ok, d = T.models_agree(off.params(), lit.params())
    assert not ok and d > 1e3 * T.AGREE_TOL


def test_checker_on_perturbed_and_mismatched_models():
    a = {"w": torch.randn(4, 3, dtype=torch.float64), "b": torch.zeros(3, dtype=torch.float64)}
    assert T.models_agree(a, {k: v.clone() for k, v in a.items()}) == (True, 0.0)
    bumped = {k: v.clone() for k, v in a.items()}
    bumped["b"][1] += 1e-6
    ok, d = T.models_agree(a, bumped)
    assert not ok and d == pytest.approx(1e-6 / max(1.0, float(a["w"].abs().max())))
    assert T.models_agree(a, {"w": a["w"]}) == (False, float("inf"))
    assert T.models_agree(a, {"w": a["w"], "b": torch.zeros(4)})[0] is False


def test_workload_shapes():
    pfl = T.Workload("conv", "cnn", "fashion_mnist", 1000, 50, 50, 5, 10, 0.05, 128)
    if T.fashion_present(T.FASHION_DIR):
        assert T.make_workloads(["conv"], None, quick=False) == [pfl]
    (conv,) = T.make_workloads(["conv"], None, quick=True, data_dir="")
    assert (conv.data, conv.cohort, conv.local_steps, conv.batch_size) == ("digits", 10, 5, 10)
    logreg = T.make_workloads(["logreg"], None, quick=False)
    assert [(w.clients, w.cohort, w.local_steps, w.batch_size) for w in logreg] == [
        (k, k, 5, 16) for k in (10, 100, 1000)
    ]
    net = T.build_net(T.Workload(**{**pfl.__dict__, "model": "simple_cnn"}), (1, 28, 28), 10, 0)
    assert sum(p.numel() for p in net.parameters()) == 1_199_882  # pfl-research's simple_cnn
    assert not list(net.buffers())


@pytest.mark.parametrize(
    "flag,layout,name",
    [("--data-dir", "flat", "mnist"), ("--fashion-dir", "FashionMNIST/raw", "fashion_mnist")],
)
def test_conv_runs_on_idx_files_from_a_folder(tmp_path, capsys, keep_threads, monkeypatch, flag,
                                              layout, name):  # fmt: skip
    """--data-dir takes MNIST (or Fashion-MNIST) IDX files for the conv workload, and the
    records and the output say which data ran; --fashion-dir is --data-dir for Fashion-MNIST."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    root = tmp_path / "idx"
    folder = root if layout == "flat" else root / layout
    write_idx(folder, "train", *make_set(60, 1), gz=True)
    write_idx(folder, "t10k", *make_set(10, 2), gz=False)
    argv = ["--workloads", "conv", "--clients", "1", "--threads", "1", "--repeat", "1",
            "--min-time", "0", "--check-rounds", "1", flag, str(root)]  # fmt: skip
    records = T.main(argv)
    assert {(r["data"], r["data_dir"], r["per_client"]) for r in records} == {(name, str(root), 50)}
    assert all(r["agrees"] is not False for r in records)
    out = capsys.readouterr().out
    assert f"conv data: {name} from {root}" in out
    assert ("fmnist" if name == "fashion_mnist" else "mnist") + " K=1" in out


def test_which_idx_data_a_folder_holds(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    for sub in ("MNIST/raw", "FashionMNIST/raw"):
        write_idx(tmp_path / "tv" / sub, "train", *make_set(2, 0), gz=False)
        write_idx(tmp_path / "tv" / sub, "t10k", *make_set(2, 1), gz=False)
    assert T.idx_source(str(tmp_path / "tv")) == "mnist"  # the first layout found
    assert T.idx_source(str(tmp_path / "tv"), "fashion_mnist") == "fashion_mnist"
    write_idx(tmp_path / "flat", "train", *make_set(2, 0), gz=True)
    write_idx(tmp_path / "flat", "t10k", *make_set(2, 1), gz=True)
    write_idx(tmp_path / "my-fashion-files", "train", *make_set(2, 0), gz=True)
    write_idx(tmp_path / "my-fashion-files", "t10k", *make_set(2, 1), gz=True)
    assert T.idx_source(str(tmp_path / "flat")) == "mnist"
    assert T.idx_source(str(tmp_path / "my-fashion-files")) == "fashion_mnist"
    assert T.idx_source(str(tmp_path / "flat"), "fashion_mnist") == "fashion_mnist"  # as told
    write_idx(tmp_path / "t10k-only", "t10k", *make_set(2, 0), gz=True)
    assert T.idx_source(str(tmp_path / "t10k-only")) == "" == T.idx_source("")
    write_idx(tmp_path / "train-only", "train", *make_set(2, 0), gz=True)  # its test split gone
    assert T.idx_source(str(tmp_path / "train-only")) == ""
    (conv,) = T.make_workloads(["conv"], [2], quick=True, data_dir=str(tmp_path / "flat"))
    assert (conv.data, conv.clients, conv.per_client) == ("mnist", 2, 50)
    with pytest.raises(ValueError, match=r"has 2 training images; conv needs 2 clients × 50"):
        T.build_data(conv, 0, str(tmp_path / "flat"))


@pytest.mark.parametrize(
    "argv",
    [
        ["--data-dir", "/nonexistent-folder"],
        ["--data-dir", "/tmp", "--fashion-dir", "/tmp"],
        ["--clients", "0"],
        ["--workloads", "lenet"],
        ["--repeat", "0"],
        ["--threads", "-1"],
        ["--min-time", "nan"],
        ["--check-rounds", "-1"],
        ["--impls", "vectorized"],
        ["--json", "/nonexistent-folder/x.json"],
        ["--workloads", "logreg", "--clients", "5000"],
        ["--clients", "ten"],
        ["--no-such-flag"],
        ["--devices", "0"],
        ["--updater", "scaffold"],
        ["--shard-data"],
    ],
)
def test_bad_input_exits_2_with_one_line(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        T.parse_args(argv)
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("python -m lit_fedco.benchmarks.throughput: ")


def test_bad_input_from_the_command_line():
    proc = subprocess.run(
        [sys.executable, "-m", "lit_fedco.benchmarks.throughput", "--repeat", "0"],
        capture_output=True, text=True, cwd=REPO, timeout=120,
        env={"PYTHONPATH": str(REPO), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert proc.returncode == 2
    assert proc.stderr.splitlines() == [
        "python -m lit_fedco.benchmarks.throughput: error: --repeat: got 0, need an integer >= 1"
    ]
    assert proc.stdout == ""


@pytest.mark.skipif(torch.cuda.is_available(), reason="a CUDA device is here")
def test_cuda_without_a_device_exits_2(capsys):
    with pytest.raises(SystemExit) as exc:
        T.parse_args(["--device", "cuda"])
    assert exc.value.code == 2 and capsys.readouterr().err.count("\n") == 1


def test_a_folder_without_the_test_split_is_refused_before_anything_runs(tmp_path, capsys):
    """The conv workloads read both splits: a folder of training files alone is named in one
    line at the command line (it failed with a traceback from the loader before)."""
    write_idx(tmp_path / "mnist", "train", *make_set(60, 0), gz=True)
    with pytest.raises(SystemExit) as exc:
        T.parse_args(["--workloads", "conv", "--data-dir", str(tmp_path / "mnist")])
    err = capsys.readouterr().err
    assert exc.value.code == 2 and err.count("\n") == 1
    assert "t10k-images-idx3-ubyte" in err and str(tmp_path / "mnist") in err
