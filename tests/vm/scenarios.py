"""The arrays the interoperability harness builds, in quick (CI) and full mode.

Two directions:
  l2u  Linux md creates the array (mdadm --create in the VM), fills it with the seeded
       pattern, optionally fails members and writes more; uraid on the host must read the
       same bytes.
  u2l  uraid creates and fills the array on the host; Linux md must assemble it without a
       resync, with the same geometry and bytes; Linux writes more, uraid reads it back.
"""

from __future__ import annotations

import dataclasses
import itertools

RAID5_LAYOUTS = [
    "left-asymmetric", "right-asymmetric", "left-symmetric", "right-symmetric",
    "parity-first", "parity-last",
]
RAID6_LAYOUTS = RAID5_LAYOUTS + [
    "ddf-zero-restart", "ddf-N-restart", "ddf-N-continue",
    "left-asymmetric-6", "right-asymmetric-6", "left-symmetric-6", "right-symmetric-6",
    "parity-first-6",
]
SHORT = {
    "left-asymmetric": "la", "right-asymmetric": "ra", "left-symmetric": "ls",
    "right-symmetric": "rs", "parity-first": "pf", "parity-last": "pl",
    "ddf-zero-restart": "ddfzr", "ddf-N-restart": "ddfnr", "ddf-N-continue": "ddfnc",
    "left-asymmetric-6": "la6", "right-asymmetric-6": "ra6", "left-symmetric-6": "ls6",
    "right-symmetric-6": "rs6", "parity-first-6": "pf6",
}


@dataclasses.dataclass
class Spec:
    direction: str  # "l2u" or "u2l"
    level: int
    ndisks: int
    layout: str | None = None  # mdadm's spelling; None = the level's default
    chunk_k: int = 64  # 0 = the tool's default (mdadm: 512K); ignored for raid1
    sizes_mib: tuple[int, ...] = ()  # per member; empty = all the mode's default size
    bitmap: str | None = None  # "internal", "none" or None (tool default)
    # l2u: members that mdadm --fail marks faulty after the fill (then more data is written).
    # u2l: slots created as "missing".
    fail: tuple[int, ...] = ()
    resync: bool = False  # l2u: let md resync instead of --assume-clean
    # u2l: members that uraid marks faulty (uraid serve, uraid fail, uraid stop) after the
    # fill; their images still go to Linux, which must leave them out.
    marked: tuple[int, ...] = ()
    metadata: str = "1.2"  # "1.0" (end), "1.1" (start), "1.2", or "0.90" (last 64 KiB)
    # Members flagged write-mostly at create (md's devflags): l2u by mdadm's --write-mostly
    # (which flags every device after it, so these must be the last ones), u2l by uraid's
    # --write-mostly DEV. The other side must see the flag: uraid's detail and mdadm
    # --examine for l2u, (W) in /proc/mdstat and "writemostly" in mdadm --detail for u2l.
    write_mostly: tuple[int, ...] = ()
    # u2l: `uraid grow` arguments run on the host after the fill, with `grow_add` new members
    # given to its --add; Linux must then find the array as `grown` says: (level, raid
    # devices, layout), recovered onto the added members, with the same bytes.
    grow: tuple[str, ...] = ()
    grow_add: int = 0
    create_size_k: int = 0  # u2l: `uraid create --size` (KiB per member); 0 = all of it
    grown: tuple[int, int, str | None] | None = None
    name: str = ""

    def __post_init__(self) -> None:
        if not self.name:
            parts = [self.direction, f"raid{self.level}"]
            if self.layout:
                parts.append(SHORT.get(self.layout, self.layout))
            if self.level != 1:
                parts.append(f"c{self.chunk_k}" if self.chunk_k else "cdefault")
            parts.append(f"n{self.ndisks}")
            if len(set(self.sizes_mib)) > 1:
                parts.append("mixed")
            if self.metadata != "1.2":
                parts.append("e" + self.metadata.replace(".", ""))
            if self.bitmap == "internal":
                parts.append("bitmap")
            if self.resync:
                parts.append("resync")
            if self.fail:
                word = "fail" if self.direction == "l2u" else "missing"
                parts.append(word + "".join(str(f) for f in self.fail))
            if self.marked:
                parts.append("marked" + "".join(str(f) for f in self.marked))
            if self.write_mostly:
                parts.append("wm" + "".join(str(f) for f in self.write_mostly))
            if self.grown:
                level, n, layout = self.grown
                parts.append(f"grow-raid{level}" + (f"-{SHORT.get(layout, layout)}" if layout else "")
                             + f"-n{n}")
                if "--size" in self.grow:
                    parts.append("size-" + self.grow[self.grow.index("--size") + 1])
                if "--bitmap" in self.grow:
                    parts.append("bitmap-" + self.grow[self.grow.index("--bitmap") + 1])
            self.name = "-".join(parts)
        wm = sorted(self.write_mostly)
        assert wm == list(range(self.ndisks - len(wm), self.ndisks)), \
            f"{self.name}: write_mostly must be the last members (mdadm flags those after it)"

    def member_sizes(self, default_mib: int) -> list[int]:
        return list(self.sizes_mib) if self.sizes_mib else [default_mib] * self.ndisks

    @property
    def chunk_bytes(self) -> int:
        """What the array's chunk must be; 512K is mdadm's default since 3.1."""
        return (self.chunk_k or 512) * 1024

    @property
    def redundant(self) -> bool:
        return self.level != 0


def L(level: int, n: int, **kw) -> Spec:
    return Spec("l2u", level, n, **kw)


def U(level: int, n: int, **kw) -> Spec:
    return Spec("u2l", level, n, **kw)


def quick() -> list[Spec]:
    l2u = [
        L(0, 2), L(0, 3, chunk_k=4),
        L(0, 3, layout="alternate", sizes_mib=(12, 16, 20)),
        L(1, 2), L(1, 3, bitmap="internal"), L(1, 2, fail=(0,)),
        L(10, 4, layout="n2"), L(10, 3, layout="n2", chunk_k=4), L(10, 4, layout="f2"),
        L(10, 3, layout="o2", chunk_k=512), L(10, 4, layout="n2", fail=(1,)),
        L(4, 4),
        L(5, 3, layout="left-asymmetric"), L(5, 4, layout="right-asymmetric", chunk_k=4),
        L(5, 4, layout="left-symmetric", bitmap="internal"),
        L(5, 5, layout="right-symmetric", chunk_k=512),
        L(5, 4, layout="parity-first"), L(5, 3, layout="parity-last"),
        L(5, 4, layout="left-symmetric", fail=(2,)), L(5, 3, resync=True),
        L(6, 4), L(6, 5, layout="right-asymmetric", chunk_k=512),
        L(6, 5, layout="left-symmetric-6"), L(6, 5, fail=(1,)),
        L(6, 6, fail=(0, 3), bitmap="internal"), L(6, 4, resync=True),
        L(5, 4, chunk_k=0),
    ]
    u2l = [
        U(0, 3), U(1, 2, bitmap="internal"), U(10, 4, layout="n2"), U(10, 3, layout="f2"),
        U(10, 4, layout="o2", chunk_k=4), U(4, 4),
        U(5, 4, layout="left-symmetric", bitmap="internal"),
        U(5, 3, layout="left-asymmetric", chunk_k=4),
        U(5, 5, layout="right-symmetric", chunk_k=512), U(5, 4, layout="parity-first"),
        U(6, 5, layout="left-symmetric"), U(6, 4, layout="right-asymmetric", chunk_k=512),
        U(1, 2, fail=(1,)), U(5, 4, layout="left-symmetric", fail=(2,)),
        U(6, 5, layout="left-symmetric", fail=(0, 3)), U(10, 4, layout="n2", fail=(1,)),
        U(5, 4, marked=(1,)), U(6, 5, marked=(0, 3)), U(1, 2, marked=(0,)),
        U(10, 4, layout="n2", marked=(2,)),
    ]
    # Metadata 1.0 (superblock at the end, data from sector 0) and 1.1 (at sector 0).
    l2u += [
        L(1, 2, metadata="1.0", bitmap="internal"), L(5, 4, metadata="1.0"),
        L(1, 2, metadata="1.1"), L(5, 3, metadata="1.1", bitmap="internal"),
    ]
    u2l += [
        U(1, 2, metadata="1.0", bitmap="internal"), U(5, 4, metadata="1.0"),
        U(1, 2, metadata="1.1"), U(5, 3, metadata="1.1", bitmap="internal"),
    ]
    # md's write-mostly flag, both ways (issue 12).
    l2u += [L(1, 3, write_mostly=(2,))]
    u2l += [U(1, 3, write_mostly=(2,))]
    # uraid grow (issue 15): mirrors added, md's raid5 -> raid6 and raid0 -> raid5 takeovers,
    # each recovered onto the added members; Linux assembles the result clean.
    u2l += [
        U(1, 2, grow=("--raid-devices", "3"), grow_add=1, grown=(1, 3, None)),
        U(5, 3, layout="left-symmetric", grow=("--level", "6"), grow_add=1,
          grown=(6, 4, "left-symmetric-6")),
        U(0, 2, grow=("--level", "5"), grow_add=1, grown=(5, 3, "parity-last")),
        U(5, 3, grow=("--bitmap", "internal"), grown=(5, 3, None)),
        U(1, 2, create_size_k=6144, grow=("--size", "max"), grown=(1, 2, None)),
        U(5, 3, create_size_k=6144, grow=("--size", "max"), grown=(5, 3, None)),
        # A bitmap added to 1.0 arrays (it goes between the data's end and the superblock),
        # and --size with a bitmap (its bits resized in place), each read back by Linux.
        U(1, 2, metadata="1.0", grow=("--bitmap", "internal"), grown=(1, 2, None)),
        U(5, 4, metadata="1.0", grow=("--bitmap", "internal"), grown=(5, 4, None)),
        U(5, 3, bitmap="internal", create_size_k=6144, grow=("--size", "max"),
          grown=(5, 3, None)),
        U(1, 2, metadata="1.0", bitmap="internal", create_size_k=6144,
          grow=("--size", "max"), grown=(1, 2, None)),
    ]
    # ... and uraid reads what mdadm --grow made of the same.
    l2u += [
        L(1, 2, grow=("--raid-devices", "3"), grow_add=1, grown=(1, 3, None)),
        L(5, 3, layout="left-symmetric",
          grow=("--level", "6", "--raid-devices", "4", "--layout", "preserve"), grow_add=1,
          grown=(6, 4, "left-symmetric-6")),
    ]
    # Metadata 0.90 (superblock in the last 64 KiB, data from sector 0, its internal
    # bitmap right after the superblock).
    l2u += [L(1, 2, metadata="0.90"), L(5, 3, metadata="0.90", fail=(1,))]
    u2l += [U(1, 2, metadata="0.90"), U(5, 4, metadata="0.90")]
    l2u += [L(1, 2, metadata="0.90", bitmap="internal")]
    u2l += [U(5, 3, metadata="0.90", bitmap="internal")]
    return l2u + u2l


def _full_direction(mk, direction: str) -> list[Spec]:
    """Every layout at 64K; every chunk size on a middle disk count; edge disk counts."""
    out: list[Spec] = []
    chunks = (4, 64, 512)
    for n, c in itertools.product((2, 3, 5), chunks):
        out.append(mk(0, n, chunk_k=c))
    if direction == "l2u":
        out.append(mk(0, 4, chunk_k=0))
        for lay in ("original", "alternate"):
            out.append(mk(0, 3, layout=lay, sizes_mib=(16, 20, 28)))
            out.append(mk(0, 4, layout=lay, sizes_mib=(16, 16, 24, 32), chunk_k=4))
    for n in (2, 3, 4):
        out.append(mk(1, n))
    out.append(mk(1, 2, bitmap="internal"))
    out.append(mk(1, 3, fail=(0,)))
    out.append(mk(1, 3, fail=(1, 2)))
    for lay in ("n2", "f2", "o2"):
        for n in (2, 3, 4, 5):
            out.append(mk(10, n, layout=lay))
        for n, c in itertools.product((3, 4), (4, 512)):
            out.append(mk(10, n, layout=lay, chunk_k=c))
        out.append(mk(10, 4, layout=lay, fail=(0,)))
    for lay in ("n3", "f3", "o3"):
        out.append(mk(10, 4, layout=lay))
    out.append(mk(10, 4, layout="n2", bitmap="internal"))
    out.append(mk(10, 4, layout="n2", fail=(0, 2)))
    for n, c in itertools.product((3, 5), chunks):
        out.append(mk(4, n, chunk_k=c))
    out.append(mk(4, 4, fail=(3,)))
    for lay in RAID5_LAYOUTS:
        for c in chunks:
            out.append(mk(5, 4, layout=lay, chunk_k=c))
        out.append(mk(5, 3, layout=lay))
        out.append(mk(5, 6, layout=lay))
        out.append(mk(5, 4, layout=lay, fail=(1,)))
    out.append(mk(5, 5, layout="left-symmetric", bitmap="internal"))
    out.append(mk(5, 5, layout="left-symmetric", bitmap="internal", fail=(4,)))
    for lay in RAID6_LAYOUTS:
        out.append(mk(6, 5, layout=lay))
    for lay in ("left-symmetric", "right-asymmetric", "parity-first", "ddf-N-continue",
                "left-asymmetric-6"):
        for c in (4, 512):
            out.append(mk(6, 5, layout=lay, chunk_k=c))
        out.append(mk(6, 4, layout=lay))
        out.append(mk(6, 7, layout=lay))
        out.append(mk(6, 6, layout=lay, fail=(1,)))
        out.append(mk(6, 6, layout=lay, fail=(0, 4)))
    out.append(mk(6, 5, bitmap="internal", fail=(2, 3)))
    if direction == "l2u":
        out.append(mk(1, 2, resync=True))
        out.append(mk(5, 4, layout="left-symmetric", resync=True))
        out.append(mk(6, 5, layout="left-symmetric", resync=True))
        out.append(mk(10, 4, layout="f2", resync=True))
    # The metadata matrix (issue 12): each version other than 1.2, for raid1/5/6/10, with
    # and without an internal bitmap, whole and degraded with a failed (l2u) or missing
    # (u2l) member; raid0 has neither bitmap nor redundancy.
    redundant = ((1, 2, None), (5, 4, None), (6, 5, None), (10, 4, "n2"))
    for md in ("0.90", "1.0", "1.1"):
        # mdadm 4.2 gives every new raid0 a layout, and 0.90 has no field for one ("0.90
        # metadata does not support layouts for RAID0"): Linux cannot make that array here.
        if not (md == "0.90" and direction == "l2u"):
            out.append(mk(0, 3, metadata=md))
        for (level, n, lay), bm, fail in itertools.product(
                redundant, ("none", "internal"), ((), (1,))):
            out.append(mk(level, n, layout=lay, metadata=md, bitmap=bm, fail=fail))
    return out


def full() -> list[Spec]:
    return _full_direction(L, "l2u") + _full_direction(U, "u2l")
