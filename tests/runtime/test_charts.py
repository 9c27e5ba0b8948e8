"""Charts: an Agg canvas of their own (pyplot, so the global backend, untouched), saved atomically as PNG."""

from __future__ import annotations

import subprocess
import sys
import textwrap


def test_a_chart_is_a_png_and_leaves_matplotlibs_backend_alone(tmp_path):
    script = textwrap.dedent(f"""
        import sys
        from pathlib import Path
        from examples.tau2.runtime.charts import new_figure, save_png
        fig, axes = new_figure(4.0, 2.0, panels=2)
        for ax in axes:
            ax.plot([1, 2], [3, 4])
        path = save_png(fig, Path({str(tmp_path / "c.png")!r}))
        print(len(axes), path.read_bytes()[:4] == b"\\x89PNG", "matplotlib.pyplot" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["2", "True", "False"]
    assert [p.name for p in tmp_path.iterdir()] == ["c.png"]
