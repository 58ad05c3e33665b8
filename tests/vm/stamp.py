#!/usr/bin/env python3
"""Linux md and the never-written map's stamp (issue 18; full mode, `scripts/test.sh
--full`): uraid stops a raid1 over members that cannot say where they were never written
(nbdkit without structured replies) with a map saved and its superblocks stamped (a nonce
in utime's microseconds). Linux md assembles the copied images as any array, writes once,
and stops: its superblock writes carry whole seconds (and its events may come back to the
very count uraid saved), so the next `uraid serve` must refuse the saved map; the same
map offered with the untouched images is taken.

    python3 tests/vm/stamp.py [--uraid PATH]
"""
import argparse
import os
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import harness  # noqa: E402
from harness import Boot, Pattern, MiB  # noqa: E402


def fail(why: str) -> None:
    print(f"FAIL stamp: {why}", flush=True)
    sys.exit(1)


def stamp(img: Path) -> tuple[int, int]:
    """(utime's microseconds field, events) of a 1.2 member image."""
    with open(img, "rb") as f:
        f.seek(4096)
        b = f.read(256)
    return struct.unpack_from("<Q", b, 192)[0] >> 40, struct.unpack_from("<Q", b, 200)[0]


def wait_for(path: Path, what: str, proc: subprocess.Popen, log: Path) -> None:
    deadline = time.monotonic() + 60
    while not path.exists():
        if proc.poll() is not None:
            fail(f"{what} exited: {log.read_text(errors='replace')}")
        if time.monotonic() > deadline:
            fail(f"{what} did not come up")
        time.sleep(0.05)


def serve(uraid: Path, d: Path, name: str, members: list[str], env: dict) -> str:
    """`uraid serve` on `members` until it answers, then `uraid stop`; its stderr."""
    ctl, log = d / f"{name}.ctl", d / f"{name}.log"
    with open(log, "wb") as out:
        p = subprocess.Popen([str(uraid), "serve", "--nbd", f"unix:{d / name}.nbd", "--control",
                              str(ctl), *members], stdout=subprocess.DEVNULL, stderr=out, env=env)
    try:
        wait_for(ctl, f"uraid serve ({name})", p, log)
        subprocess.run([str(uraid), "stop", "--control", str(ctl)], check=True, env=env,
                       capture_output=True)
        p.wait(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
    return log.read_text(errors="replace")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--uraid")
    args = ap.parse_args()
    uraid = harness.find_uraid(args.uraid)
    if uraid is None:
        fail("no uraid binary (cargo build -p uraid)")
    for tool in ("nbdkit", "qemu-io", "nbdcopy", "qemu-system-x86_64"):
        if shutil.which(tool) is None:
            fail(f"{tool} is missing")
    d = Path(tempfile.mkdtemp(prefix="uraid-stamp-"))
    env = dict(os.environ, URAID_STATE_DIR=str(d / "state"), URAID_RUN_DIR=str(d / "run"))
    (d / "run").mkdir()
    hosts = []
    try:
        uris = []
        for n in ("a", "b"):
            sock = d / f"{n}.sock"
            hosts.append(subprocess.Popen(["nbdkit", "-f", "--exit-with-parent", "-U", str(sock),
                                           "--no-sr", "memory", "64M"]))
            wait_for(sock, f"nbdkit {n}", hosts[-1], d / "none")
            uris.append(f"nbd+unix:///?socket={sock}")
        subprocess.run([str(uraid), "create", "-l", "1", "-n", "2", "--assume-clean", "--run",
                        *uris], check=True, env=env, capture_output=True)
        # Served: the whole array zeroed through it, 1 MiB written; a clean stop saves the map.
        ctl, log = d / "first.ctl", d / "first.log"
        with open(log, "wb") as out:
            p = subprocess.Popen([str(uraid), "serve", "--nbd", f"unix:{d}/first.nbd",
                                  "--control", str(ctl), *uris],
                                 stdout=subprocess.DEVNULL, stderr=out, env=env)
        wait_for(ctl, "uraid serve", p, log)
        subprocess.run(["qemu-io", "-f", "raw", f"nbd+unix:///?socket={d}/first.nbd",
                        "-c", "write -z 0 60M", "-c", "write -P 0x11 1M 1M"],
                       check=True, capture_output=True)
        subprocess.run([str(uraid), "stop", "--control", str(ctl)], check=True, env=env,
                       capture_output=True)
        p.wait(timeout=60)
        saved = list((d / "state").glob("*.written"))
        if len(saved) != 1:
            fail(f"the clean stop saved {saved}: {log.read_text(errors='replace')}")
        shutil.copy(saved[0], d / "saved.bak")
        imgs = []
        for n, uri in zip(("a", "b"), uris):
            img = d / f"{n}.img"
            subprocess.run(["nbdcopy", uri, str(img)], check=True)
            shutil.copy(img, d / f"{n}0.img")
            imgs.append(img)
        for h in hosts:
            h.kill()
        before = [stamp(i) for i in imgs]
        if any(micros == 0 for micros, _ in before):
            fail(f"no nonce in utime after the stop: {before}")

        # Linux: assemble, read, write 4 KiB, stop.
        run = Path(tempfile.mkdtemp(prefix="stamp-", dir=d))
        b = Boot(run, "stamp", Pattern(64 * MiB))
        disks = [b.add_disk(i) for i in imgs]
        b.job += [
            "mdadm --assemble --run /dev/md0 " + " ".join(disks) + " >/share/out/assemble 2>&1",
            "dd if=/dev/md0 bs=1M skip=1 count=1 2>/dev/null | od -An -tx1 | head -1"
            " >/share/out/data",
            "dd if=/dev/zero of=/dev/md0 bs=4096 count=1 seek=4000 oflag=direct 2>/dev/null",
            "sleep 1",
            "mdadm --stop /dev/md0 >/share/out/stop 2>&1",
        ]
        b.budget_s = 240
        b.boot(float(os.environ.get("URAID_VM_TIMEOUT_SCALE", "1")))
        out = b.share / "out"
        if not b.finished():
            fail(f"{b.vm_problem()}\n{b.console_tail()}")
        data = (out / "data").read_text().split() if (out / "data").exists() else []
        if data[:4] != ["11"] * 4:
            fail(f"Linux read {data[:4]} where uraid wrote 0x11: "
                 f"{(out / 'assemble').read_text(errors='replace')}")
        after = [stamp(i) for i in imgs]
        if any(micros != 0 for micros, _ in after):
            fail(f"Linux's superblock writes kept the nonce: {after}")
        print(f"PASS stamp: Linux md assembled the stamped raid1 and read uraid's data; its "
              f"writes left utime in whole seconds (events {before[0][1]} -> {after[0][1]})",
              flush=True)

        text = serve(uraid, d, "after-linux", [str(i) for i in imgs], env)
        if "saved map not used" not in text or "written since" not in text:
            fail(f"uraid took the map after Linux wrote the array: {text}")
        print("PASS stamp: after Linux wrote the array, uraid serve refuses the saved map",
              flush=True)
        shutil.copy(d / "saved.bak", saved[0])
        text = serve(uraid, d, "untouched", [str(d / "a0.img"), str(d / "b0.img")], env)
        if "known never written since the last clean stop" not in text:
            fail(f"uraid did not take the map with the untouched members: {text}")
        print("PASS stamp: with the members as uraid left them, the saved map is taken",
              flush=True)
    finally:
        for h in hosts:
            h.kill()
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
