#!/usr/bin/env python3
"""Linux md <-> uraid interoperability harness (project issue 3). Python 3.11 stdlib only.

    tests/vm/run.sh                 # quick mode (CI): a few minutes, two VM boots
    tests/vm/run.sh --full          # every layout, chunk size and disk count
    tests/vm/run.sh --only 'raid6'  # scenarios whose name matches a regex
    tests/vm/run.sh --list          # print the scenario names and exit
    URAID=/path/to/uraid tests/vm/run.sh   # default: target/debug/uraid, then target/release

Boots the Debian 6.12 kernel that setup.sh fetched under qemu TCG, with the member images as
virtio-scsi disks and tests/vm/.cache/runs/<run>/<boot>/share as a virtio-9p share. Prints
one line per scenario, `PASS name` or `FAIL name: why` (followed by the relevant output),
and exits non-zero if any failed. See tests/vm/README.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import mmap
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scenarios  # noqa: E402
from scenarios import Spec  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CACHE = HERE / ".cache"
MiB = 1 << 20
QUICK_MEMBER_MIB = 8
FULL_MEMBER_MIB = 16
MAX_DISKS_PER_BOOT = 200  # virtio-scsi allows 255 targets; leave room
MAX_ARRAYS_PER_BOOT = 60  # keeps a hung boot from costing a whole full run
# Free space left beside one boot's member images: the build, logs and other suites share
# the disk. Below it the images go to a memory file system (see image_dir).
SPARE_MIB = 1024
SHM = Path("/dev/shm")
URAID_TIMEOUT_S = 300

RAID10_NAMES = {"n": "near", "f": "far", "o": "offset"}


class Failure(Exception):
    """A scenario failed; the message says why, `details` holds the relevant output."""

    def __init__(self, why: str, details: str = "") -> None:
        super().__init__(why)
        self.why = why
        self.details = details


# ---------------------------------------------------------------------------- pattern

class Pattern:
    """Seeded bytes: half A (seed 1) fills arrays, half B (seed 2) is written later.

    The file is attached to the VM read-only as scsi id 0; the host computes expected
    checksums from the same file, so a guest checksum can be checked against a model."""

    def __init__(self, half_bytes: int) -> None:
        self.half = half_bytes
        self.path = CACHE / f"pattern-{half_bytes // MiB}M.bin"
        if not self.path.exists() or self.path.stat().st_size != 2 * half_bytes:
            tmp = self.path.with_suffix(".tmp")
            with open(tmp, "wb") as f:
                for seed in (1, 2):
                    rng = random.Random(seed)
                    for _ in range(half_bytes // MiB):
                        f.write(rng.randbytes(MiB))
            tmp.rename(self.path)
        self._file = open(self.path, "rb")
        self.map = mmap.mmap(self._file.fileno(), 0, access=mmap.ACCESS_READ)

    def model_sha(self, size: int, writes: list[tuple[int, int]]) -> str:
        """sha256 of A[:size] after each (dst, len) region was overwritten from B."""
        h = hashlib.sha256()
        pos = 0
        for dst, length in sorted(writes):
            h.update(self.map[pos:dst])
            h.update(self.map[self.half + dst:self.half + dst + length])
            pos = dst + length
        h.update(self.map[pos:size])
        return h.hexdigest()

    def a_bytes(self, size: int) -> memoryview:
        return memoryview(self.map)[:size]


def regions(size: int) -> list[tuple[int, int]]:
    """The (offset, length) regions written after the fill; 4K aligned, not stripe aligned.

    Must match write_regions() in the job script below."""
    r1 = ((size // 8) // 4096 * 4096 + 12288, (size // 4) // 4096 * 4096)
    r2 = ((size * 5 // 8) // 4096 * 4096 + 4096, (size // 8) // 4096 * 4096)
    return [r for r in (r1, r2) if r[1] > 0]


WRITE_REGIONS_SH = r"""
write_regions() {
    [ -n "$FAILED" ] && return 1
    _o1=$(( (SIZE / 8) / 4096 * 4096 + 12288 )); _l1=$(( (SIZE / 4) / 4096 * 4096 ))
    _o2=$(( (SIZE * 5 / 8) / 4096 * 4096 + 4096 )); _l2=$(( (SIZE / 8) / 4096 * 4096 ))
    run write1 put $PAT $((PB + _o1)) /dev/md0 $_o1 $_l1 || return 1
    run write2 put $PAT $((PB + _o2)) /dev/md0 $_o2 $_l2
}
"""


# ---------------------------------------------------------------------------- uraid

def find_uraid(explicit: str | None) -> Path | None:
    asked = explicit or os.environ.get("URAID")
    if asked:
        if not (Path(asked).is_file() and os.access(asked, os.X_OK)):
            sys.exit(f"harness: uraid binary {asked} (--uraid or $URAID) is not executable")
        return Path(asked).resolve()
    for c in (REPO / "target/debug/uraid", REPO / "target/release/uraid"):
        if c and Path(c).is_file() and os.access(c, os.X_OK):
            return Path(c).resolve()
    return None


def uraid_run(uraid: Path, args: list[str], stdin: bytes | memoryview | None = None,
              timeout: int = URAID_TIMEOUT_S) -> str:
    cmd = [str(uraid)] + args
    try:
        p = subprocess.run(cmd, input=stdin, capture_output=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise Failure(f"`uraid {args[0]}` timed out after {timeout}s", " ".join(cmd))
    if p.returncode != 0:
        raise Failure(f"`uraid {args[0]}` exited {p.returncode}",
                      " ".join(cmd) + "\n" + p.stderr.decode(errors="replace")[-3000:])
    return p.stdout.decode(errors="replace")


def uraid_read_sha(uraid: Path, members: list[str]) -> tuple[str, int]:
    """Stream `uraid read MEMBERS...` into sha256; returns (hex, byte count)."""
    cmd = [str(uraid), "read"] + members
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    timer = threading.Timer(URAID_TIMEOUT_S, p.kill)
    timer.start()
    h = hashlib.sha256()
    n = 0
    try:
        assert p.stdout is not None
        while chunk := p.stdout.read(MiB):
            h.update(chunk)
            n += len(chunk)
        err = p.stderr.read().decode(errors="replace") if p.stderr else ""
        rc = p.wait()
    finally:
        timer.cancel()
    if rc != 0:
        raise Failure(f"`uraid read` exited {rc}", " ".join(cmd) + "\n" + err[-3000:])
    return h.hexdigest(), n


def uraid_detail(uraid: Path, members: list[str]) -> dict:
    out = uraid_run(uraid, ["detail", "--json"] + members)
    try:
        return json.loads(out)
    except json.JSONDecodeError as e:
        raise Failure(f"`uraid detail --json` printed no JSON ({e})", out[-2000:])


def level_num(v) -> int | None:
    m = re.search(r"\d+", str(v))
    return int(m.group()) if m else None


def check_uraid_geometry(spec: Spec, d: dict, size: int | None) -> None:
    """uraid's view of the array must agree with what was created."""
    bad = []
    if level_num(d.get("level")) != spec.level:
        bad.append(f"level {d.get('level')!r} != {spec.level}")
    if d.get("raid_disks") != spec.ndisks:
        bad.append(f"raid_disks {d.get('raid_disks')!r} != {spec.ndisks}")
    if spec.level != 1:
        want = spec.chunk_bytes
        if d.get("chunk_bytes") != want:
            bad.append(f"chunk_bytes {d.get('chunk_bytes')!r} != {want}")
    if spec.layout and spec.level in (5, 6, 10):
        got = str(d.get("layout", "")).lower()
        want_names = {spec.layout.lower()}
        if spec.level == 10:
            k = spec.layout[0]
            want_names |= {f"{RAID10_NAMES[k]}={spec.layout[1:]}", f"{RAID10_NAMES[k]}{spec.layout[1:]}"}
        if got not in want_names:
            bad.append(f"layout {d.get('layout')!r} != {spec.layout}")
    if "degraded" in d and bool(d["degraded"]) != bool(spec.fail):
        bad.append(f"degraded {d['degraded']!r} but {len(spec.fail)} member(s) failed")
    for m in d.get("members") or []:
        if isinstance(m, dict) and m.get("role") in spec.fail and m.get("state") == "active":
            bad.append(f"failed member {m.get('role')} reported active (stale by events)")
    if size is not None and d.get("array_bytes") != size:
        bad.append(f"array_bytes {d.get('array_bytes')!r} != {size} (Linux)")
    if bad:
        raise Failure("uraid detail disagrees: " + "; ".join(bad), json.dumps(d, indent=1)[:3000])


# ---------------------------------------------------------------------------- VM

def free_mib(path: Path) -> int:
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize // MiB


def image_dir(preferred: Path, label: str, need_mib: int) -> Path:
    """Where one boot's member images go: `preferred` (the run folder) when its file system
    has room for them and SPARE_MIB more; else a folder on /dev/shm (a memory file system,
    which raw images under qemu's cache=unsafe need nothing else from) when that has room;
    else a Failure that says how much is missing where. CI machines have been seen with
    under a gigabyte of disk free."""
    preferred.mkdir(parents=True, exist_ok=True)
    if free_mib(preferred) >= need_mib + SPARE_MIB:
        return preferred
    shm = SHM
    if shm.is_dir() and os.access(shm, os.W_OK) and free_mib(shm) >= need_mib + SPARE_MIB:
        d = shm / f"uraid-vm-{preferred.parent.name}-{label}"
        d.mkdir(parents=True, exist_ok=True)
        print(f"[harness] {free_mib(preferred)} MiB free beside {preferred}, {need_mib} MiB "
              f"of member images needed: they go to {d}", flush=True)
        return d
    raise Failure(f"no room for {need_mib} MiB of member images: {free_mib(preferred)} MiB "
                  f"free in {preferred}, {free_mib(shm) if shm.is_dir() else 0} MiB in "
                  f"{shm}, and {SPARE_MIB} MiB must stay free beside them; free disk "
                  "space (an old target/ or tests/vm/.cache/runs/) and run again")


class Boot:
    """One VM boot: a share folder, the pattern disk and a list of member images."""

    def __init__(self, run_dir: Path, label: str, pattern: Pattern) -> None:
        self.dir = run_dir / label
        self.img_dir = self.dir  # see image_dir
        self.label = label
        self.share = self.dir / "share"
        self.share.mkdir(parents=True, exist_ok=True)
        (self.share / "out").mkdir(exist_ok=True)
        self.pattern = pattern
        self.disks: list[Path] = []  # scsi id = index + 1
        self.unmap_disks: set[Path] = set()
        self.job: list[str] = []
        self.guest_bins: list[Path] = []  # host binaries to run in the guest, from /share/bin
        self.budget_s = 60.0
        self.console = ""
        self.timed_out = False
        self.elapsed_s = 0.0

    def new_image(self, name: str, mib: int) -> Path:
        """A sparse member image of `mib` MiB in this boot's image folder (see image_dir)."""
        img = self.img_dir / f"{name}.img"
        img.unlink(missing_ok=True)
        with open(img, "wb") as f:
            f.truncate(mib * MiB)
        return img

    def add_disk(self, path: Path, unmap: bool = False) -> str:
        """unmap: the guest's discards and zero writes punch holes in the image file."""
        self.disks.append(path)
        if unmap:
            self.unmap_disks.add(path)
        return f"/dev/disk/{len(self.disks)}"

    def boot(self, timeout_scale: float) -> None:
        shutil.copy(HERE / "guest-lib.sh", self.share / "lib.sh")
        (self.share / "ndisks").write_text(f"{len(self.disks) + 1}\n")
        self._copy_guest_bins()
        script = ["export PATH=/share/bin:$PATH LD_LIBRARY_PATH=/share/lib",
                  ". /share/lib.sh", f"PB={self.pattern.half}", WRITE_REGIONS_SH, "set -u"]
        (self.share / "job.sh").write_text("\n".join(script + self.job) + "\n")
        cmd = ["qemu-system-x86_64", "-accel", "tcg", "-cpu", "max", "-smp", "2", "-m", "2048",
               "-nographic", "-no-reboot", "-nic", "none",
               "-kernel", str(CACHE / "vmlinuz"), "-initrd", str(CACHE / "base.cpio.gz"),
               "-append", "console=ttyS0 loglevel=3 panic=-1",
               "-device", "virtio-scsi-pci,id=scsi0",
               "-virtfs", f"local,path={self.share},mount_tag=share,security_model=none,id=share"]
        all_disks = [(self.pattern.path, True)] + [(d, False) for d in self.disks]
        for i, (path, ro) in enumerate(all_disks):
            ro_opt = ",readonly=on" if ro else ""
            if path in self.unmap_disks:
                ro_opt += ",discard=unmap,detect-zeroes=unmap"
            cmd += ["-drive", f"file={path},format=raw,if=none,id=d{i},cache=unsafe{ro_opt}",
                    "-device", f"scsi-hd,bus=scsi0.0,drive=d{i},scsi-id={i},lun=0"]
        timeout = int(self.budget_s * timeout_scale)
        log = self.dir / "console.log"
        t0 = time.monotonic()
        # A guest kernel that dies before init prints its first marker ran no step of the
        # job, so booting again is safe: under TCG the kernel's early text patching has
        # been seen to oops (int3 in sched_clock_cpu) once in many boots.
        for attempt in (1, 2):
            with open(log, "wb") as out:
                p = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out,
                                     stderr=subprocess.STDOUT, start_new_session=True)
                try:
                    p.wait(timeout=timeout)
                except subprocess.TimeoutExpired:
                    self.timed_out = True
                    os.killpg(p.pid, signal.SIGKILL)
                    p.wait()
            self.console = log.read_text(errors="replace")
            if self.timed_out or "@@" in self.console or attempt == 2:
                break
            print("[harness] the guest kernel died before init started the job; booting "
                  "again (the first console is kept in console-1.log)", flush=True)
            (self.dir / "console-1.log").write_text(self.console)
        self.elapsed_s = time.monotonic() - t0
        if self.timed_out:
            self.console += f"\n[harness] qemu killed after {timeout}s\n"
        (self.dir / "qemu-cmd.txt").write_text(" ".join(cmd) + "\n")

    def _copy_guest_bins(self) -> None:
        """Binaries that change between runs (uraid) travel in the share, not the initramfs,
        with whatever libraries ldd lists that the base initramfs lacks."""
        if not self.guest_bins:
            return
        (self.share / "bin").mkdir(exist_ok=True)
        (self.share / "lib").mkdir(exist_ok=True)
        for b in self.guest_bins:
            shutil.copy(b, self.share / "bin" / b.name)
            ldd = subprocess.run(["ldd", str(b)], capture_output=True, text=True).stdout
            for lib in re.findall(r"(/\S+\.so[\S]*)", ldd):
                if not (CACHE / "root" / lib.lstrip("/")).exists():
                    shutil.copy(lib, self.share / "lib" / Path(lib).name)

    def finished(self) -> bool:
        return "@@VM done" in self.console

    def vm_problem(self) -> str:
        markers = [ln for ln in self.console.splitlines() if "@@" in ln]
        last = markers[-1].strip() if markers else "(no marker: kernel or init failed)"
        why = "VM timed out" if self.timed_out else "VM stopped before the job finished"
        return f"{why}; last marker: {last}"

    def console_tail(self, n: int = 25) -> str:
        return "\n".join(self.console.splitlines()[-n:])


class GuestResult:
    def __init__(self, boot: Boot, name: str) -> None:
        self.dir = boot.share / "out" / name
        self.boot = boot
        self.name = name
        self.kv: dict[str, str] = {}
        rf = self.dir / "result"
        if rf.exists():
            for line in rf.read_text(errors="replace").splitlines():
                if "=" in line:
                    k, v = line.split("=", 1)
                    self.kv[k] = v

    def file(self, name: str) -> str:
        p = self.dir / name
        return p.read_text(errors="replace") if p.exists() else ""

    def log_tail(self, n: int = 30) -> str:
        return "\n".join(self.file("log").splitlines()[-n:])

    def require_ok(self) -> None:
        if self.kv.get("done") == "ok":
            return
        if "done" not in self.kv:
            if not self.boot.finished():
                raise Failure(self.boot.vm_problem(),
                              f"guest log:\n{self.log_tail()}\nconsole:\n{self.boot.console_tail()}")
            raise Failure("guest never ran this array", self.boot.console_tail())
        step = self.kv["done"]
        raise Failure(f"guest step `{step}` failed",
                      f"guest log:\n{self.log_tail()}\ndmesg tail:\n{self.file('dmesg')[-2500:]}")

    def int(self, key: str) -> int:
        try:
            return int(self.kv[key])
        except (KeyError, ValueError):
            raise Failure(f"guest recorded no {key}", self.log_tail())


def scsi_budget(spec: Spec, member_mib: int) -> float:
    """Rough guest seconds for one array under TCG, for the boot timeout."""
    total = sum(spec.member_sizes(member_mib))
    return 6 + total * 0.25 + (total * 0.3 if spec.resync else 0)


# ---------------------------------------------------------------------------- l2u

def mdadm_create_args(spec: Spec, disks: list[str]) -> list[str]:
    a = ["mdadm", "--create", "/dev/md0", "--run", f"--metadata={spec.metadata}",
         f"--level={spec.level}",
         f"--raid-devices={spec.ndisks}"]
    if spec.layout:
        a.append(f"--layout={spec.layout}")
    if spec.chunk_k and spec.level != 1:
        a.append(f"--chunk={spec.chunk_k}")
    if spec.bitmap:
        a.append(f"--bitmap={spec.bitmap}")
    if not spec.resync and spec.level != 0:
        # The images are zeroes, and zeroes are consistent parity and mirrors.
        a.append("--assume-clean")
    if spec.write_mostly:
        # mdadm's --write-mostly flags the devices after it (the spec keeps them last).
        first = min(spec.write_mostly)
        return a + disks[:first] + ["--write-mostly"] + disks[first:]
    return a + disks


class L2U:
    def __init__(self, spec: Spec, boot: Boot, member_mib: int) -> None:
        self.spec = spec
        self.boot = boot
        self.images: list[Path] = []
        disks = []
        for i, mib in enumerate(spec.member_sizes(member_mib)):
            img = boot.new_image(f"{spec.name}.{i}", mib)
            self.images.append(img)
            disks.append(boot.add_disk(img))
        j = [f"begin {spec.name}", "run create " + " ".join(mdadm_create_args(spec, disks))]
        if spec.resync:
            j.append("wait_sync")
        j += ["snap created", "size", "run fill put $PAT 0 /dev/md0 0 $SIZE", "sha filled"]
        for f in spec.fail:
            j.append(f"run fail{f} mdadm /dev/md0 --fail {disks[f]}")
        if spec.fail:
            j += ["write_regions", "sha final"]
        if spec.grow:
            # mdadm --add then --grow, as a user sequences them; md recovers the new roles.
            for i in range(spec.grow_add):
                img = boot.new_image(f"{spec.name}.add{i}", member_mib)
                self.images.append(img)
                j.append(f"run add{i} mdadm /dev/md0 --add {boot.add_disk(img)}")
            j += ["run grow mdadm --grow /dev/md0 " + " ".join(spec.grow), "wait_sync",
                  "snap grown", "sha filled"]
            level, n, layout = spec.grown
            self.spec = dataclasses.replace(spec, level=level, ndisks=n, layout=layout)
        j += ["finish"]
        boot.job += j
        boot.budget_s += scsi_budget(spec, member_mib)

    def verify(self, uraid: Path | None) -> str:
        g = GuestResult(self.boot, self.spec.name)
        g.require_ok()
        size = g.int("size")
        want = self.boot.pattern.model_sha(size, [])
        if g.kv.get("filled") != want:
            raise Failure("Linux read back different bytes than the pattern it was given "
                          "(harness or md problem)", g.log_tail())
        final = "filled"
        if self.spec.fail:
            final = "final"
            want = self.boot.pattern.model_sha(size, regions(size))
            if g.kv.get("final") != want:
                raise Failure("Linux's degraded read-back differs from the model", g.log_tail())
        if uraid is None:
            return "linux side only (no uraid binary)"
        members = [str(p) for p in reversed(self.images)]  # order must not matter
        d = uraid_detail(uraid, members)
        check_uraid_geometry(self.spec, d, size)
        if self.spec.write_mostly:
            mdstat = g.file("mdstat.created")
            if mdstat.count("(W)") != len(self.spec.write_mostly):
                raise Failure("Linux did not flag the write-mostly members", mdstat)
            got = [i for i, m in enumerate(d.get("members", [])) if m.get("write_mostly")]
            if got != sorted(self.spec.write_mostly):
                raise Failure(f"uraid sees write-mostly members {got}, Linux made "
                              f"{sorted(self.spec.write_mostly)}", json.dumps(d)[:2000])
        got, n = uraid_read_sha(uraid, members)
        if n != size or got != g.kv[final]:
            raise Failure(f"uraid read {n} bytes sha {got[:16]}, Linux had {size} bytes "
                          f"sha {g.kv[final][:16]}",
                          "mdadm --detail in the guest:\n" + g.file("detail.end")[-2500:])
        # uraid read must leave the members as it found them: clean, by mdadm's reading.
        for i, img in enumerate(self.images):
            if i in self.spec.fail:
                continue
            ex = subprocess.run(["mdadm", "--examine", str(img)], capture_output=True, text=True)
            state = detail_field(ex.stdout, "State")
            if ex.returncode != 0 or state != "clean":
                raise Failure(f"after `uraid read`, host mdadm --examine of member {i} says "
                              f"State {state!r}", (ex.stdout + ex.stderr)[-2500:])
            flags = detail_field(ex.stdout, "Flags")
            if (flags == "write-mostly") != (i in self.spec.write_mostly):
                raise Failure(f"after `uraid read`, member {i} has Flags {flags!r}",
                              ex.stdout[-2500:])
        return ""


# ---------------------------------------------------------------------------- u2l

def detail_field(detail: str, key: str) -> str:
    m = re.search(rf"^\s*{re.escape(key)}\s*:\s*(.*?)\s*$", detail, re.M)
    return m.group(1) if m else ""


def expected_md_layout(spec: Spec) -> str | None:
    if spec.level in (5, 6):
        return spec.layout or "left-symmetric"
    if spec.level == 10:
        lay = spec.layout or "n2"
        return f"{RAID10_NAMES[lay[0]]}={lay[1:]}"
    return None


class U2L:
    def __init__(self, spec: Spec, boot: Boot, member_mib: int, uraid: Path) -> None:
        self.spec = spec
        self.member_mib = member_mib
        self.boot = boot
        self.uraid = uraid
        self.images: list[Path | None] = []
        self.size = 0
        self.prep_error: Failure | None = None
        for i, mib in enumerate(spec.member_sizes(member_mib)):
            if i in spec.fail:
                self.images.append(None)
                continue
            self.images.append(boot.new_image(f"{spec.name}.{i}", mib))
        try:
            self._create()
        except Failure as e:
            self.prep_error = e
            return
        disks = [boot.add_disk(p) for p in self.present]
        j = [f"begin {spec.name}",
             "run assemble mdadm --assemble --run /dev/md0 " + " ".join(disks),
             "snap assembled", "size", "sha initial", "snap afterread"]
        if spec.redundant and not spec.fail and not spec.marked:
            j.append("check_parity")
        j += ["write_regions", "sha final", "finish"]
        boot.job += j
        boot.budget_s += scsi_budget(spec, member_mib) * 1.5

    @property
    def present(self) -> list[Path]:
        return [p for p in self.images if p is not None]

    def _create(self) -> None:
        s = self.spec
        a = ["create", "--level", str(s.level), "--raid-devices", str(s.ndisks),
             "--metadata", s.metadata]
        if s.layout:
            a += ["--layout", s.layout]
        if s.level != 1:
            a += ["--chunk", f"{s.chunk_bytes // 1024}K"]
        if s.bitmap:
            a += ["--bitmap", s.bitmap]
        if s.create_size_k:
            a += ["--size", f"{s.create_size_k}K"]
        a += [str(p) if p else "missing" for p in self.images]
        for i in s.write_mostly:
            a += ["--write-mostly", str(self.images[i])]
        uraid_run(self.uraid, a)
        members = [str(p) for p in self.present]
        d = uraid_detail(self.uraid, members)
        check_uraid_geometry(s, d, None)
        size = d.get("array_bytes")
        if not isinstance(size, int) or size <= 0 or size > self.boot.pattern.half:
            raise Failure(f"uraid detail gave array_bytes {size!r}", json.dumps(d)[:2000])
        self.size = size
        uraid_run(self.uraid, ["write"] + members, stdin=self.boot.pattern.a_bytes(size))
        got, n = uraid_read_sha(self.uraid, members[::-1])
        want = self.boot.pattern.model_sha(size, [])
        if got != want or n != size:
            raise Failure(f"uraid on the host read back different bytes than it wrote "
                          f"({n} of {size} bytes)")
        if s.marked:
            self._mark_failed(members)
        if s.grow:
            self._grow(members)

    def _grow(self, members: list[str]) -> None:
        """`uraid grow` with --add on the host; the spec then describes the grown array."""
        s = self.spec
        adds = [self.boot.new_image(f"{s.name}.add{i}", self.member_mib)
                for i in range(s.grow_add)]
        uraid_run(self.uraid, ["grow", *s.grow] + (["--add", *map(str, adds)] if adds else [])
                  + ["--"] + members)
        self.images += adds
        level, n, layout = s.grown
        bitmap = s.grow[s.grow.index("--bitmap") + 1] if "--bitmap" in s.grow else s.bitmap
        self.spec = dataclasses.replace(s, level=level, ndisks=n, layout=layout, bitmap=bitmap)
        grown = [str(p) for p in self.present]
        if "--size" in s.grow:
            # The grown region: resynced by uraid (Linux must find no sync owed), then the
            # pattern over the whole new size.
            uraid_run(self.uraid, ["resync"] + grown)
            size = uraid_detail(self.uraid, grown).get("array_bytes")
            if not isinstance(size, int) or size <= self.size or size > self.boot.pattern.half:
                raise Failure(f"after --size max, array_bytes {size!r} (was {self.size})")
            self.size = size
            uraid_run(self.uraid, ["write"] + grown, stdin=self.boot.pattern.a_bytes(size))
        d = uraid_detail(self.uraid, grown)
        check_uraid_geometry(self.spec, d, self.size)
        got, n_read = uraid_read_sha(self.uraid, grown[::-1])
        if got != self.boot.pattern.model_sha(self.size, []) or n_read != self.size:
            raise Failure("uraid read different bytes after the grow", json.dumps(d)[:2000])

    def _mark_failed(self, members: list[str]) -> None:
        """Mark members faulty the way a user would: serve, `uraid fail`, `uraid stop`."""
        s = self.spec
        ctl = self.boot.dir / f"{s.name}.ctl"
        sock = self.boot.dir / f"{s.name}.nbd"
        srv = subprocess.Popen([str(self.uraid), "serve", "--nbd", f"unix:{sock}",
                                "--control", str(ctl)] + members,
                               stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            for _ in range(200):
                if ctl.exists():
                    break
                time.sleep(0.05)
            for role in s.marked:
                uraid_run(self.uraid, ["fail", "--control", str(ctl), str(role)])
            uraid_run(self.uraid, ["stop", "--control", str(ctl)])
            srv.wait(timeout=60)
        finally:
            if srv.poll() is None:
                srv.kill()
                srv.wait()
        if srv.returncode != 0:
            out = srv.stdout.read().decode(errors="replace") if srv.stdout else ""
            raise Failure(f"uraid serve exited with {srv.returncode}", out[-2000:])
        d = uraid_detail(self.uraid, members)
        if not d.get("degraded"):
            raise Failure("uraid did not record the members it marked faulty", json.dumps(d)[:2000])

    def verify(self) -> str:
        if self.prep_error:
            raise Failure("on the host: " + self.prep_error.why, self.prep_error.details)
        g = GuestResult(self.boot, self.spec.name)
        g.require_ok()
        s = self.spec
        detail = g.file("detail.assembled")
        bad = []
        level = detail_field(detail, "Raid Level")
        if level != f"raid{s.level}":
            bad.append(f"Raid Level {level!r}")
        want_layout = expected_md_layout(s)
        if want_layout and detail_field(detail, "Layout") != want_layout:
            bad.append(f"Layout {detail_field(detail, 'Layout')!r} != {want_layout}")
        if s.level != 1:
            chunk = detail_field(detail, "Chunk Size")
            if chunk != f"{s.chunk_bytes // 1024}K":
                bad.append(f"Chunk Size {chunk!r}")
        if detail_field(detail, "Raid Devices") != str(s.ndisks):
            bad.append(f"Raid Devices {detail_field(detail, 'Raid Devices')!r}")
        state = detail_field(detail, "State")
        words = {w.strip() for w in state.split(",")}
        if not words & {"clean", "active"}:
            bad.append(f"State {state!r}")
        degraded = bool(s.fail or s.marked)
        if ("degraded" in words) != degraded:
            bad.append(f"State {state!r} ({'not ' if degraded else ''}expected degraded)")
        for w in ("resyncing", "recovering", "reshaping", "FAILED", "Not Started"):
            if w in words:
                bad.append(f"State {state!r}")
        if s.bitmap == "internal" and detail_field(detail, "Intent Bitmap") != "Internal":
            bad.append("no internal bitmap")
        if s.write_mostly:
            flagged = g.file("mdstat.assembled").count("(W)")
            if flagged != len(s.write_mostly):
                bad.append(f"/proc/mdstat shows {flagged} (W) members, uraid made "
                           f"{len(s.write_mostly)}")
            rows = [ln for ln in detail.splitlines() if "writemostly" in ln]
            if len(rows) != len(s.write_mostly):
                bad.append(f"mdadm --detail lists {len(rows)} writemostly members")
        for tag in ("assembled", "afterread"):
            mdstat = g.file(f"mdstat.{tag}")
            if re.search(r"resync|recovery|reshape|check", mdstat):
                bad.append(f"/proc/mdstat {tag} shows a sync: "
                           + " ".join(mdstat.split())[:200])
            action = g.file(f"sync_action.{tag}").strip()
            if action not in ("", "idle"):
                bad.append(f"sync_action {tag} = {action}")
        if bad:
            raise Failure("Linux assembled it differently: " + "; ".join(bad),
                          f"mdadm --detail:\n{detail}\nmdstat:\n{g.file('mdstat.assembled')}")
        size = g.int("size")
        if size != self.size:
            raise Failure(f"Linux array size {size} != uraid array_bytes {self.size}", detail)
        if g.kv.get("initial") != self.boot.pattern.model_sha(size, []):
            raise Failure("Linux read different bytes than uraid wrote", detail)
        if "mismatch_cnt" in g.kv and g.kv["mismatch_cnt"] != "0":
            raise Failure(f"md check found mismatch_cnt={g.kv['mismatch_cnt']} "
                          "(parity or mirrors written by uraid disagree)", g.log_tail())
        want = self.boot.pattern.model_sha(size, regions(size))
        if g.kv.get("final") != want:
            raise Failure("Linux's read-back after its own writes differs from the model",
                          g.log_tail())
        got, n = uraid_read_sha(self.uraid, [str(p) for p in self.present])
        if got != want or n != size:
            raise Failure(f"uraid read {n} bytes sha {got[:16]} after Linux wrote, "
                          f"Linux had sha {want[:16]}", g.file("detail.end")[-2500:])
        return ""


# ---------------------------------------------------------------------------- main

def report(name: str, ok: bool, why: str = "", details: str = "", note: str = "") -> None:
    if ok:
        print(f"PASS {name}" + (f" ({note})" if note else ""), flush=True)
    else:
        print(f"FAIL {name}: {why}", flush=True)
        if details:
            for line in details.rstrip().splitlines():
                print(f"    | {line}")
        sys.stdout.flush()


def split_batches(specs: list[Spec], member_mib: int) -> list[list[Spec]]:
    batches: list[list[Spec]] = []
    cur: list[Spec] = []
    disks = 0
    for s in specs:
        if cur and (disks + s.ndisks > MAX_DISKS_PER_BOOT or len(cur) >= MAX_ARRAYS_PER_BOOT):
            batches.append(cur)
            cur, disks = [], 0
        cur.append(s)
        disks += s.ndisks
    if cur:
        batches.append(cur)
    return batches


def run_script(args) -> int:
    """Boot once with the given disks and run one script: a building block for other suites
    (the ublk/NBD export tests) that need a real Linux next to uraid."""
    run_dir = CACHE / "runs" / time.strftime("script-%Y%m%d-%H%M%S")
    boot = Boot(run_dir, "vm", Pattern(64 * MiB))
    for d in args.disk:
        boot.add_disk(Path(d).resolve())
    uraid = find_uraid(args.uraid)
    if uraid:
        boot.guest_bins.append(uraid)
    boot.job.append(Path(args.script).read_text())
    boot.budget_s = args.boot_timeout
    boot.boot(1.0)
    # The binaries are copies: a run's logs stay, its 50 MB of uraid does not.
    for d in ("bin", "lib"):
        shutil.rmtree(boot.share / d, ignore_errors=True)
    print((boot.share / "out" / "job.log").read_text(errors="replace")
          if (boot.share / "out" / "job.log").exists() else "", end="")
    if not boot.finished():
        print(f"{boot.vm_problem()}\n{boot.console_tail()}", file=sys.stderr)
        return 124
    rc = (boot.share / "out" / "job.rc").read_text().strip()
    return int(rc) if rc.isdigit() else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--full", action="store_true", help="all layouts, chunk sizes, disk counts")
    ap.add_argument("--only", help="run scenarios whose name matches this regex")
    ap.add_argument("--list", action="store_true", help="list scenarios and exit")
    ap.add_argument("--uraid", help="uraid binary (default $URAID, target/debug/uraid)")
    ap.add_argument("--allow-missing-uraid", action="store_true",
                    help="without a uraid binary, check the Linux side only and exit 0")
    ap.add_argument("--keep", action="store_true", help="keep images of passing scenarios")
    ap.add_argument("--timeout-scale", type=float, default=1.0,
                    help="multiply the VM timeouts (slow or busy machines)")
    ap.add_argument("--script", help="instead of the scenarios: run this shell script in the "
                    "VM (disks are /dev/disk/1.., uraid is in PATH), print its output, exit "
                    "with its status")
    ap.add_argument("--disk", action="append", default=[], help="with --script: attach IMG")
    ap.add_argument("--boot-timeout", type=int, default=600, help="with --script: seconds")
    args = ap.parse_args()
    if args.script:
        return run_script(args)

    specs = scenarios.full() if args.full else scenarios.quick()
    if args.only:
        specs = [s for s in specs if re.search(args.only, s.name)]
    names = [s.name for s in specs]
    dup = {n for n in names if names.count(n) > 1}
    assert not dup, f"duplicate scenario names: {dup}"
    if args.list:
        print("\n".join(names))
        return 0
    if not specs:
        print("no scenario matches", file=sys.stderr)
        return 2

    t_start = time.monotonic()
    member_mib = FULL_MEMBER_MIB if args.full else QUICK_MEMBER_MIB
    uraid = find_uraid(args.uraid)
    if uraid is None:
        print("note: no uraid binary (set URAID or build target/debug/uraid); "
              "l2u checks the Linux side only, u2l is skipped", flush=True)
    biggest = max(sum(s.member_sizes(member_mib)) for s in specs)
    pattern = Pattern(-(-biggest * MiB // (64 * MiB)) * 64 * MiB)

    runs = CACHE / "runs"
    if runs.is_dir():
        old = sorted(p for p in runs.iterdir() if p.is_dir() and not p.is_symlink())
        for p in old[:-4]:
            shutil.rmtree(p, ignore_errors=True)
    run_dir = runs / time.strftime("%Y%m%d-%H%M%S")
    run_dir.mkdir(parents=True, exist_ok=True)
    latest = CACHE / "runs" / "latest"
    latest.unlink(missing_ok=True)
    latest.symlink_to(run_dir.name)
    print(f"run folder: {run_dir}", flush=True)
    if uraid is not None:
        # Others rebuild target/debug/uraid while we run; one run tests one binary.
        (run_dir / "bin").mkdir()
        shutil.copy2(uraid, run_dir / "bin" / "uraid")
        print(f"uraid: {uraid} (copied to {run_dir / 'bin'})", flush=True)
        uraid = run_dir / "bin" / "uraid"

    failed: list[str] = []
    skipped: list[str] = []

    def run_batch(label: str, batch: list[Spec], make, verify) -> None:
        """One boot: its images are made, checked, and those of passing arrays removed
        before the next boot makes its own, so the disk holds one boot's images at most."""
        boot = Boot(run_dir, label, pattern)
        try:
            check_batch(boot, batch, make, verify)
        finally:
            if boot.img_dir != boot.dir and not args.keep:
                # A memory file system: what a failing array left there goes too.
                shutil.rmtree(boot.img_dir, ignore_errors=True)

    def check_batch(boot: Boot, batch: list[Spec], make, verify) -> None:
        need = sum(sum(s.member_sizes(member_mib)) + s.grow_add * member_mib for s in batch)
        try:
            boot.img_dir = image_dir(boot.dir, boot.label, need)
            t0 = time.monotonic()
            arrays = [make(s, boot) for s in batch]
        except (Failure, OSError) as e:
            why = e.why if isinstance(e, Failure) else f"making the member images: {e}"
            for s in batch:
                failed.append(s.name)
                report(s.name, False, why)
            return
        prep_s = time.monotonic() - t0
        if boot.job:
            boot.boot(args.timeout_scale)
        print(f"# boot {boot.label}: {len(batch)} arrays, {len(boot.disks)} disks, "
              f"{prep_s:.0f}s prepared on the host, {boot.elapsed_s:.0f}s in the VM", flush=True)
        for a in arrays:
            try:
                note = verify(a)
            except Failure as e:
                failed.append(a.spec.name)
                report(a.spec.name, False, e.why, e.details)
                continue
            report(a.spec.name, True, note=note)
            if not args.keep:
                for img in a.images:
                    if img is not None:
                        img.unlink(missing_ok=True)

    l2u = [s for s in specs if s.direction == "l2u"]
    u2l = [s for s in specs if s.direction == "u2l"]
    for bi, batch in enumerate(split_batches(l2u, member_mib)):
        run_batch(f"l2u-{bi}", batch, lambda s, boot: L2U(s, boot, member_mib),
                  lambda a: a.verify(uraid))

    if uraid is None:
        skipped += [s.name for s in u2l]
        for s in u2l:
            print(f"SKIP {s.name}: no uraid binary")
    else:
        for bi, batch in enumerate(split_batches(u2l, member_mib)):
            run_batch(f"u2l-{bi}", batch, lambda s, boot: U2L(s, boot, member_mib, uraid),
                      lambda a: a.verify())

    total = len(specs)
    print(f"# {total - len(failed) - len(skipped)} passed, {len(failed)} failed, "
          f"{len(skipped)} skipped of {total} in {time.monotonic() - t_start:.0f}s; "
          f"logs in {run_dir}", flush=True)
    if failed:
        return 1
    if skipped or uraid is None:
        return 0 if args.allow_missing_uraid else 3
    return 0


if __name__ == "__main__":
    sys.exit(main())
