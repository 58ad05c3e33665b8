"""Where the VM suites put their member images when the disk is short (harness.image_dir and
scratch.sh's vm_scratch): on the disk while it keeps SPARE_MIB free beside them, else in
memory, else a failure that says what is missing where. No VM, no root: the free space is
faked (free_mib patched; a `df` ahead in PATH).

    python3 -m unittest tests/vm/test_scratch.py      (scripts/test.sh runs it)
"""
from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import harness  # noqa: E402


class ImageDir(unittest.TestCase):
    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        base = Path(self.tmp.name)
        self.disk = base / "runs" / "20261206-000000" / "u2l-0"
        self.shm = base / "shm"
        self.shm.mkdir()
        self.free = {}
        self.saved = (harness.free_mib, harness.SHM)
        harness.free_mib = lambda p: self.free["shm" if Path(p) == self.shm else "disk"]
        harness.SHM = self.shm

    def tearDown(self) -> None:
        harness.free_mib, harness.SHM = self.saved
        self.tmp.cleanup()

    def test_the_disk_while_it_keeps_the_spare(self) -> None:
        self.free = {"disk": 1000 + harness.SPARE_MIB, "shm": 10**6}
        self.assertEqual(harness.image_dir(self.disk, "u2l-0", 1000), self.disk)

    def test_memory_when_the_disk_would_keep_less(self) -> None:
        self.free = {"disk": 999 + harness.SPARE_MIB, "shm": 10**6}
        d = harness.image_dir(self.disk, "u2l-0", 1000)
        self.assertEqual(d.parent, self.shm)
        self.assertTrue(d.is_dir())
        self.assertIn("20261206-000000", d.name)

    def test_a_failure_that_names_both_places_when_neither_has_room(self) -> None:
        self.free = {"disk": 300, "shm": 500}
        with self.assertRaises(harness.Failure) as e:
            harness.image_dir(self.disk, "u2l-0", 1000)
        why = e.exception.why
        for part in ("1000 MiB", "300 MiB free in", str(self.disk), "500 MiB in",
                     str(self.shm), "free disk space"):
            self.assertIn(part, why)
        self.assertEqual(list(self.shm.iterdir()), [])


class VmScratch(unittest.TestCase):
    """scratch.sh under bash, with a `df` that reports FREE_TMP for $TMPDIR and FREE_SHM
    for /dev/shm."""

    def setUp(self) -> None:
        self.tmp = tempfile.TemporaryDirectory()
        # A cleanup, not tearDown: cleanups run last in, first out, so a folder a test
        # made there is removed before the whole.
        self.addCleanup(self.tmp.cleanup)
        base = Path(self.tmp.name)
        self.tmpdir = base / "tmp"
        self.tmpdir.mkdir()
        bin_dir = base / "bin"
        bin_dir.mkdir()
        df = bin_dir / "df"
        df.write_text('#!/bin/sh\n'
                      'eval "last=\\${$#}"\n'
                      'case "$last" in /dev/shm) f=$FREE_SHM ;; *) f=$FREE_TMP ;; esac\n'
                      'echo "Filesystem 1048576-blocks Used Available Capacity Mounted"\n'
                      'echo "fake 100000 0 $f 0% $last"\n')
        df.chmod(0o755)
        self.path = f"{bin_dir}:{os.environ['PATH']}"

    def scratch(self, free_tmp: int, free_shm: int, need: int) -> subprocess.CompletedProcess:
        env = dict(os.environ, PATH=self.path, TMPDIR=str(self.tmpdir),
                   FREE_TMP=str(free_tmp), FREE_SHM=str(free_shm))
        script = f'. "{HERE}/scratch.sh"; set -e; W="$(vm_scratch test-vm {need})"; echo "$W"'
        r = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True)
        made = Path(r.stdout.strip()) if r.stdout.strip() else None
        if made is not None and made.is_dir():
            # Also when an assertion fails: a folder in /dev/shm would outlive the test.
            self.addCleanup(made.rmdir)
        return r

    def test_tmpdir_while_it_keeps_the_spare(self) -> None:
        r = self.scratch(1024 + 400, 10**6, 400)
        self.assertEqual(r.returncode, 0, r.stderr)
        w = Path(r.stdout.strip())
        self.assertEqual(w.parent, self.tmpdir)
        self.assertTrue(w.name.startswith("uraid-test-vm."))
        self.assertEqual(r.stderr, "")

    def test_memory_when_tmpdir_would_keep_less(self) -> None:
        r = self.scratch(1024 + 399, 10**6, 400)
        self.assertEqual(r.returncode, 0, r.stderr)
        w = Path(r.stdout.strip())
        self.assertEqual(w.parent, Path("/dev/shm"))
        self.assertIn("member images in memory", r.stderr)

    def test_a_failure_that_names_both_places_when_neither_has_room(self) -> None:
        r = self.scratch(100, 200, 400)
        self.assertNotEqual(r.returncode, 0)
        self.assertEqual(r.stdout.strip(), "")
        for part in ("FAIL test-vm", "400 MiB", f"100 MiB free in {self.tmpdir}",
                     "200 MiB free in /dev/shm", "free disk space"):
            self.assertIn(part, r.stderr)
        self.assertEqual(list(self.tmpdir.iterdir()), [])


if __name__ == "__main__":
    unittest.main()
