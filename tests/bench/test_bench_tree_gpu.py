"""bench/bench_tree_gpu.py on a CPU at a tiny shape: the GPU bench's rows, its two modes, its table and its
report, so that the script a lent GPU machine runs cannot rot between the days one is lent."""

from __future__ import annotations

import gzip
import json
import subprocess
import sys

import pytest

from bench import bench_tree_gpu


@pytest.mark.memory(gib=10)  # the bench's trainers on a CPU (9.7 GiB measured; tests/conftest.py)
@pytest.mark.slow
@pytest.mark.timeout(600)
def test_the_gpu_bench_runs_both_modes_on_a_cpu_and_the_tree_computes_fewer_tokens(tmp_path):
    rows_dir = tmp_path / "rows"
    bench_tree_gpu.main(["rows", "--out", str(rows_dir), "--episodes", "1", "--turns", "2",
                         "--policy-words", "20", "--tools", "1"])
    assert sorted(p.name for p in rows_dir.iterdir()) == ["rows.json.gz", "tokenizer.json",
                                                          "tokenizer_config.json"]
    with gzip.open(rows_dir / "rows.json.gz", "rt") as f:
        rows = json.load(f)["rows"]
    assert len(rows) == 2 and all(0 < r["n_generated"] < len(r["input_ids"]) for r in rows)
    # the episode's second turn extends its first: the prefix the tree shares
    assert rows[1]["input_ids"][:len(rows[0]["input_ids"]) - rows[0]["n_generated"]] == \
        rows[0]["input_ids"][:len(rows[0]["input_ids"]) - rows[0]["n_generated"]]
    out = tmp_path / "report.json"
    # as a GPU machine runs it: through the stand-ins for the packages it lacks (bench/device/)
    done = subprocess.run([sys.executable, "bench/device/stand_ins.py", "bench/bench_tree_gpu.py", "run",
                           "--rows", str(rows_dir), "--shape", "tiny", "--iters", "1", "--warmup", "0",
                           "--max-tokens-per-mb", "4096", "--work", str(tmp_path / "w"), "--out", str(out)],
                          capture_output=True, text=True, timeout=500, cwd=bench_tree_gpu.REPO)
    assert done.returncode == 0, done.stderr[-4000:]
    report = json.loads(out.read_text())
    off, on = report["results"]
    assert (off["mode"], on["mode"], report["device"]) == ("off", "on", "CPU")
    assert off["tokens_in_rows"] == on["tokens_in_rows"] == sum(len(r["input_ids"]) for r in rows)
    assert on["tokens_computed"] < off["tokens_in_rows"] <= off["tokens_computed"]
    assert report["logprob_max_abs_gap"] < 1e-4  # float32: the tree changes which tokens run, not results
    assert report["speedup"] == pytest.approx(off["step_s"] / on["step_s"])
    assert off["mfu"] is None and off["peak_memory_gib"] is None  # no GPU: no peak to compare with
    table = done.stdout
    assert ("| tree | tokens computed | compute_logp s | ppo_update s | step s | row tokens/s | peak GiB "
            "| MFU") in table
    assert f"| on | {on['tokens_computed']:,} |" in table


def test_the_stand_ins_let_a_script_import_subclass_and_decorate_with_packages_that_are_not_there(tmp_path):
    """bench/device/stand_ins.py, as the GPU machine runs the bench through it."""

    script = tmp_path / "uses_ray.py"
    script.write_text(
        "import sys\n"
        "import ray\nfrom wandb.sdk import Settings\nfrom datasets import Dataset\n"
        "class Mine(Dataset):\n    pass\n"
        "@ray.remote\ndef f():\n    return 3\n"
        "assert f() == 3 and not ray.is_initialized() and isinstance(Mine(), Dataset) and not Settings\n"
        "print('ran with', sys.argv[1:])\n")
    done = subprocess.run([sys.executable, "bench/device/stand_ins.py", str(script), "--x", "1"],
                          capture_output=True, text=True, timeout=60, cwd=bench_tree_gpu.REPO)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "ran with ['--x', '1']"
