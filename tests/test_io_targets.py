"""Outputs through symlinks and to streams (hostile inputs F10).

Every write goes through ``predictor.io.atomic_writer``: a symlink is followed
and its target replaced atomically (the link stays a link); a dangling link
gets its target created; a loop is a one-line error naming the path (CLI:
exit 2); a pipe, FIFO or device is written directly, never replaced; a regular
file is still replaced atomically (a killed writer leaves the previous file).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from predictor.errors import WriteError
from predictor.io import atomic_write_text, atomic_writer, resolve_target

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(os.name != "posix", reason="symlinks, FIFOs and /proc")


def cli(*args, cwd=None, timeout=600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "predictor.cli", *args], capture_output=True,
                          text=True, timeout=timeout, cwd=cwd,
                          env={**os.environ, "PYTHONWARNINGS": "ignore",
                               "PYTHONPATH": str(ROOT)})


def test_link_to_a_regular_file_keeps_the_link_and_updates_the_target(tmp_path):
    real = tmp_path / "real.csv"
    real.write_text("old\n")
    real.chmod(0o640)
    link = tmp_path / "link.csv"
    link.symlink_to("real.csv")
    atomic_write_text(link, "new\n")
    assert link.is_symlink() and os.readlink(link) == "real.csv"
    assert real.read_text() == "new\n" and (real.stat().st_mode & 0o777) == 0o640
    # A chain of links, one relative to a linked folder.
    (tmp_path / "sub").mkdir()
    (tmp_path / "dirlink").symlink_to("sub")
    (tmp_path / "sub" / "hop").symlink_to("../link.csv")
    atomic_write_text(tmp_path / "dirlink" / "hop", "newer\n")
    assert real.read_text() == "newer\n"
    assert (tmp_path / "sub" / "hop").is_symlink() and link.is_symlink()
    # No temp file left anywhere; none was made beside the link's folder.
    names = sorted(p.name for p in tmp_path.rglob("*"))
    assert names == ["dirlink", "hop", "link.csv", "real.csv", "sub"], names


def test_dangling_link_creates_its_target(tmp_path):
    link = tmp_path / "out.json"
    link.symlink_to(tmp_path / "made" / "target.json")
    atomic_write_text(link, "{}")
    assert link.is_symlink()
    assert (tmp_path / "made" / "target.json").read_text() == "{}"


def test_symlink_loop_is_one_line_naming_the_path(tmp_path):
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    for path in (tmp_path / "a", tmp_path / "a" / "x.csv"):
        with pytest.raises(WriteError) as info:
            atomic_write_text(path, "x")
        msg = str(info.value)
        assert path.name in msg and "loop" in msg and "\n" not in msg, msg
    assert (tmp_path / "a").is_symlink() and (tmp_path / "b").is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


def test_folder_is_refused(tmp_path):
    with pytest.raises(WriteError, match="folder"):
        atomic_write_text(tmp_path, "x")


def test_pipe_via_proc_fd_is_written_directly(tmp_path):
    r, w = os.pipe()
    try:
        path = f"/proc/self/fd/{w}"
        if not os.path.exists(path):
            pytest.skip("no /proc/self/fd")
        real, st, direct, own = resolve_target(path)
        assert direct and own == w
        with atomic_writer(path, "w") as f:
            f.write("a,b\n1,2\n")
        os.close(w)
        w = -1
        assert os.read(r, 1000) == b"a,b\n1,2\n"
    finally:
        os.close(r)
        if w >= 0:
            os.close(w)


def test_fifo_is_written_directly_and_stays_a_fifo(tmp_path):
    fifo = tmp_path / "out.csv"
    os.mkfifo(fifo)
    link = tmp_path / "link.csv"
    link.symlink_to(fifo)
    got: list[bytes] = []
    reader = threading.Thread(target=lambda: got.append(fifo.read_bytes()), daemon=True)
    reader.start()
    with atomic_writer(link, "wb") as f:
        f.write(b"x" * 200_000)  # larger than a pipe's buffer
    reader.join(30)
    assert got == [b"x" * 200_000]
    assert fifo.is_fifo() and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["link.csv", "out.csv"]


def test_character_device_is_written_directly(tmp_path):
    link = tmp_path / "null.csv"
    link.symlink_to("/dev/null")
    atomic_write_text(link, "discarded")
    assert link.is_symlink() and os.readlink(link) == "/dev/null"
    assert list(tmp_path.iterdir()) == [link]


KILLED = textwrap.dedent("""
    import sys, time
    from predictor.io import atomic_writer
    with atomic_writer(sys.argv[1]) as f:
        f.write(b"new" * 100000)
        f.flush()
        print("writing", flush=True)
        time.sleep(60)
""")


def test_killed_writer_through_a_link_leaves_the_previous_target(tmp_path):
    real = tmp_path / "real.json"
    real.write_text(json.dumps({"version": "old"}))
    link = tmp_path / "link.json"
    link.symlink_to(real)
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(link)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    try:
        assert proc.stdout.readline().strip() == "writing", proc.stderr.read()
        time.sleep(0.2)
        os.kill(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    assert json.loads(real.read_text()) == {"version": "old"} and link.is_symlink()
    # The stray temp file (if any) is beside the target, never named like it.
    assert all(p.name.startswith(".real.json.") for p in tmp_path.iterdir()
               if p not in (real, link))


def test_sweep_csv_dash_is_standard_output(tmp_path):
    """`sweep --csv -`: the CSV alone on stdout (no table, no file named
    "-"), its notes on stderr, as `predict --csv` prints; refused beside
    --json, which prints on stdout too."""
    proc = cli("sweep", "dcgan", "-b", "8,16", "--gpus", "T4,L4", "--csv", "-", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("model,gpu,batch_size") and len(lines) == 5, proc.stdout
    assert "samples/s" not in proc.stdout and not (tmp_path / "-").exists()
    assert "predictor: note: L4: not a chip" in proc.stderr
    proc = cli("sweep", "dcgan", "-b", "8", "--gpus", "T4", "--csv", "-", "--json", cwd=tmp_path)
    err = proc.stderr.strip()
    assert proc.returncode == 2 and "\n" not in err and "choose one" in err, err
    assert proc.stdout == ""
    # A saved graph is read back by its .npz suffix: another name is refused
    # before tracing, and nothing is written.
    for name in ("-", "r50"):
        proc = cli("sweep", "dcgan", "-b", "8", "--gpus", "T4", "--save-graph", name,
                   cwd=tmp_path)
        err = proc.stderr.strip()
        assert proc.returncode == 2 and "\n" not in err and ".npz" in err, err
        assert not (tmp_path / name).exists()


def test_cli_csv_through_links_and_stdout(tmp_path):
    real = tmp_path / "real.csv"
    real.write_text("old\n")
    (tmp_path / "link.csv").symlink_to("real.csv")
    proc = cli("sweep", "dcgan", "-b", "8", "--gpus", "T4", "--csv", "link.csv", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (tmp_path / "link.csv").is_symlink()
    assert real.read_text().startswith("model,gpu,batch_size")
    # /dev/stdout into a pipe: the table arrives on stdout, nothing replaced.
    proc = cli("sweep", "dcgan", "-b", "8", "--gpus", "T4", "--csv", "/dev/stdout",
               cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.startswith("model,gpu,batch_size"), proc.stdout[:500]
    assert Path("/dev/stdout").is_symlink() or Path("/dev/stdout").is_char_device()
    # /dev/stdout redirected to a file: the table and the summary both kept, in order.
    out = tmp_path / "out.txt"
    with open(out, "w") as fh:
        done = subprocess.run([sys.executable, "-m", "predictor.cli", "sweep", "dcgan", "-b", "8",
                               "--gpus", "T4", "--csv", "/dev/stdout"], stdout=fh,
                              stderr=subprocess.PIPE, text=True, timeout=600, cwd=tmp_path,
                              env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    text = out.read_text()
    assert text.startswith("model,gpu,batch_size") and "samples/s" in text.split("\n", 2)[-1], text
    # A loop: one line, exit 2, naming the path.
    (tmp_path / "a.csv").symlink_to("b.csv")
    (tmp_path / "b.csv").symlink_to("a.csv")
    proc = cli("sweep", "dcgan", "-b", "8", "--gpus", "T4", "--csv", "a.csv", cwd=tmp_path)
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    assert "\n" not in err and "Traceback" not in err and "a.csv" in err and "loop" in err, err
