//! Interop with mdadm: images carrying our encoded superblocks (and bitmap) must be read by
//! `mdadm --examine` / `mdadm --examine-bitmap` as the array we meant.
//!
//! Without mdadm (.ci/run installs it) a test fails in CI and skips elsewhere.

use std::fs::{self, File, OpenOptions};
use std::io::{Seek, SeekFrom, Write};
use std::path::{Path, PathBuf};
use std::process::Command;

use uraid_core::bitmap::{self, BitmapSuper};
use uraid_core::superblock::*;

const DEVICE_SECTORS: u64 = 64 * 1024 * 2; // 64 MiB images, sparse
const SET_UUID: [u8; 16] = [
    0x3f, 0x2a, 0x91, 0x07, 0xc4, 0x5e, 0x18, 0xb2, 0x6d, 0x70, 0xe9, 0x13, 0xa8, 0x4c, 0x05, 0xfb,
];
const DEVICE_UUID: [u8; 16] = [
    0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd, 0xee, 0xf0, 0x01,
];

fn mdadm(test: &str) -> Option<PathBuf> {
    let found = uraid_testkit::skip::find_tool("mdadm");
    if found.is_none() {
        uraid_testkit::skip(test, "mdadm is not installed; interop not checked");
    }
    found
}

struct Image {
    path: PathBuf,
}

impl Image {
    fn new(tag: &str) -> Image {
        let dir = std::env::temp_dir().join(format!("uraid-sb-mdadm-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let path = dir.join(format!("{tag}.img"));
        let f = File::create(&path).unwrap();
        f.set_len(DEVICE_SECTORS * 512).unwrap();
        Image { path }
    }

    fn write_at(&self, byte_offset: u64, bytes: &[u8]) {
        let mut f = OpenOptions::new().write(true).open(&self.path).unwrap();
        f.seek(SeekFrom::Start(byte_offset)).unwrap();
        f.write_all(bytes).unwrap();
    }
}

impl Drop for Image {
    fn drop(&mut self) {
        let _ = fs::remove_file(&self.path);
        if let Some(dir) = self.path.parent() {
            let _ = fs::remove_dir(dir); // only once the last image of this run is gone
        }
    }
}

fn run(mdadm: &Path, args: &[&str], image: &Image) -> String {
    run_path(mdadm, args, &image.path)
}

fn run_path(mdadm: &Path, args: &[&str], target: &Path) -> String {
    let out = Command::new(mdadm)
        .args(args)
        .arg(target)
        .env("TZ", "UTC")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "mdadm {args:?} failed: {}\n{text}",
        String::from_utf8_lossy(&out.stderr)
    );
    text
}

/// The value mdadm prints after "key :" (first match), trimmed.
fn field<'a>(out: &'a str, key: &str) -> &'a str {
    out.lines()
        .find_map(|l| {
            let (k, v) = l.split_once(" : ")?;
            (k.trim() == key).then(|| v.trim())
        })
        .unwrap_or_else(|| panic!("mdadm output has no {key:?}:\n{out}"))
}

struct Case {
    tag: &'static str,
    level: i32,
    layout: u32,
    chunk_sectors: u32,
    raid_disks: u32,
    dev_number: u32,
    clean: bool,
    events: u64,
    features: u32,
    level_name: &'static str,
    layout_name: Option<&'static str>,
}

fn spec_for(c: &Case) -> CreateSpec {
    let data_offset = default_data_offset_sectors(
        DEVICE_SECTORS,
        c.chunk_sectors,
        default_bitmap_space_sectors(DEVICE_SECTORS),
    );
    let round = u64::from(c.chunk_sectors.max(128));
    let mut size = (DEVICE_SECTORS - data_offset) / round * round;
    if c.level == 6 {
        size -= round; // a component smaller than the member: mdadm shows "Used Dev Size"
    }
    CreateSpec {
        set_uuid: SET_UUID,
        set_name: "uraidtest:vol0".into(),
        ctime_secs: 1_700_000_000,
        level: c.level,
        layout: c.layout,
        chunk_sectors: c.chunk_sectors,
        raid_disks: c.raid_disks,
        spares: 0,
        missing: vec![],
        size_sectors: size,
        data_offset_sectors: data_offset,
        internal_bitmap: None,
        bad_block_log: true,
        clean: c.clean,
        version: MetadataVersion::V1_2,
    }
}

fn check_examine(out: &str, sb: &Superblock, c: &Case) {
    assert_eq!(field(out, "Magic"), "a92b4efc");
    assert_eq!(field(out, "Version"), "1.2");
    assert_eq!(field(out, "Feature Map"), format!("{:#x}", sb.feature_map));
    assert_eq!(field(out, "Array UUID"), uuid_string(&SET_UUID));
    assert_eq!(field(out, "Device UUID"), uuid_string(&DEVICE_UUID));
    assert_eq!(field(out, "Name"), "uraidtest:vol0");
    assert_eq!(field(out, "Raid Level"), c.level_name);
    assert_eq!(field(out, "Raid Devices"), c.raid_disks.to_string());
    assert_eq!(
        field(out, "Data Offset"),
        format!("{} sectors", sb.data_offset)
    );
    assert_eq!(field(out, "Super Offset"), "8 sectors");
    let avail = field(out, "Avail Dev Size");
    assert!(
        avail.starts_with(&format!("{} sectors", sb.data_size)),
        "{avail}"
    );
    assert_eq!(
        field(out, "State"),
        if c.clean { "clean" } else { "active" }
    );
    assert_eq!(field(out, "Events"), c.events.to_string());
    let csum = field(out, "Checksum");
    assert!(csum.ends_with("- correct"), "mdadm says checksum {csum}");
    let stored = Superblock::decode(&sb.encode()).unwrap().sb_csum;
    assert_eq!(csum, format!("{stored:x} - correct"));
    assert_eq!(
        field(out, "Device Role"),
        format!("Active device {}", c.dev_number)
    );
    assert_eq!(
        field(out, "Array State").split(' ').next().unwrap(),
        "A".repeat(c.raid_disks as usize)
    );
    if let Some((at, size)) = sb.bblog_sector() {
        let entries = u32::from(size) * 512 / 8;
        let offset = at - sb.super_offset;
        assert_eq!(
            field(out, "Bad Block Log"),
            format!("{entries} entries available at offset {offset} sectors")
        );
    }
    match c.layout_name {
        Some(name) => assert_eq!(field(out, "Layout"), name),
        None => assert!(!out.contains("Layout :"), "unexpected layout in:\n{out}"),
    }
    if c.chunk_sectors != 0 {
        assert_eq!(
            field(out, "Chunk Size"),
            format!("{}K", c.chunk_sectors / 2)
        );
    } else {
        assert!(!out.contains("Chunk Size"), "raid1 shows a chunk:\n{out}");
    }
    let data_disks = match c.level {
        1 => 1,
        4 | 5 => u64::from(c.raid_disks) - 1,
        6 => u64::from(c.raid_disks) - 2,
        10 => u64::from(c.raid_disks) / u64::from((c.layout & 0xff) * ((c.layout >> 8) & 0xff)),
        _ => 0,
    };
    if data_disks != 0 {
        let kib = sb.size * data_disks / 2;
        let shown = field(out, "Array Size");
        assert!(
            shown.starts_with(&format!("{kib} KiB ")),
            "Array Size {shown}, want {kib} KiB"
        );
    }
    if sb.level > 0 && sb.size != sb.data_size {
        let used = field(out, "Used Dev Size");
        assert!(
            used.starts_with(&format!("{} sectors", sb.size)),
            "Used Dev Size {used}"
        );
    } else {
        assert!(
            !out.contains("Used Dev Size"),
            "unexpected Used Dev Size:\n{out}"
        );
    }
}

const CASES: &[Case] = &[
    Case {
        tag: "raid0",
        level: 0,
        layout: 2,
        chunk_sectors: 1024,
        raid_disks: 3,
        dev_number: 1,
        clean: true,
        events: 7,
        features: FEATURE_RAID0_LAYOUT,
        level_name: "raid0",
        layout_name: Some("alternate"),
    },
    Case {
        tag: "raid1",
        level: 1,
        layout: 0,
        chunk_sectors: 0,
        raid_disks: 2,
        dev_number: 0,
        clean: false,
        events: 1,
        features: 0,
        level_name: "raid1",
        layout_name: None,
    },
    Case {
        tag: "raid4",
        level: 4,
        layout: 5,
        chunk_sectors: 128,
        raid_disks: 3,
        dev_number: 2,
        clean: true,
        events: 19,
        features: 0,
        level_name: "raid4",
        layout_name: None,
    },
    Case {
        tag: "raid5",
        level: 5,
        layout: 2,
        chunk_sectors: 1024,
        raid_disks: 4,
        dev_number: 3,
        clean: true,
        events: 42,
        features: 0,
        level_name: "raid5",
        layout_name: Some("left-symmetric"),
    },
    Case {
        tag: "raid6",
        level: 6,
        layout: 1,
        chunk_sectors: 256,
        raid_disks: 5,
        dev_number: 4,
        clean: false,
        events: 123_456_789_012,
        features: 0,
        level_name: "raid6",
        layout_name: Some("right-asymmetric"),
    },
    Case {
        tag: "raid10",
        level: 10,
        layout: 0x102,
        chunk_sectors: 1024,
        raid_disks: 4,
        dev_number: 0,
        clean: true,
        events: 3,
        features: 0,
        level_name: "raid10",
        layout_name: Some("near=2"),
    },
];

#[test]
fn mdadm_examines_our_superblocks() {
    let Some(mdadm) = mdadm("mdadm_examines_our_superblocks") else {
        return;
    };
    for c in CASES {
        let mut sb =
            Superblock::new_for_create(&spec_for(c), c.dev_number, DEVICE_UUID, DEVICE_SECTORS)
                .unwrap();
        sb.events = c.events;
        sb.feature_map |= c.features;
        sb.utime = 1_700_000_500;
        let image = Image::new(c.tag);
        image.write_at(SB_V12_OFFSET_BYTES, &sb.encode());
        let out = run(&mdadm, &["--examine"], &image);
        check_examine(&out, &sb, c);
    }
}

#[test]
fn mdadm_examines_our_internal_bitmap() {
    let Some(mdadm) = mdadm("mdadm_examines_our_internal_bitmap") else {
        return;
    };
    let c = &CASES[3]; // raid5
    let mut spec = spec_for(c);
    let room = default_bitmap_space_sectors(spec.size_sectors);
    let chunk = bitmap::default_chunk_bytes(spec.size_sectors, room).unwrap();
    assert_eq!(chunk, 64 << 20, "mdadm's floor for small arrays is 64 MiB");
    let bms = BitmapSuper::new(SET_UUID, spec.size_sectors, chunk, 5).unwrap();
    spec.internal_bitmap = Some((8, bms.space_bytes() / 512));
    let mut sb =
        Superblock::new_for_create(&spec, c.dev_number, DEVICE_UUID, DEVICE_SECTORS).unwrap();
    sb.events = c.events;
    assert_eq!(sb.feature_map, FEATURE_BITMAP_OFFSET);
    let image = Image::new("raid5-bitmap");
    image.write_at(SB_V12_OFFSET_BYTES, &sb.encode());
    image.write_at(
        sb.bitmap_sector().unwrap() * 512,
        &bitmap::initial_area(&bms),
    );

    let out = run(&mdadm, &["--examine"], &image);
    check_examine(&out, &sb, c);
    assert_eq!(field(&out, "Internal Bitmap"), "8 sectors from superblock");

    // On a regular file mdadm -X reads an external bitmap file (bitmap at byte 0), so give it
    // the area read back from where the superblock says it is.
    let area_at = sb.bitmap_sector().unwrap() * 512;
    let area =
        fs::read(&image.path).unwrap()[area_at as usize..][..bms.space_bytes() as usize].to_vec();
    let bitmap_file = Image::new("raid5-bitmap-area");
    let f = File::create(&bitmap_file.path).unwrap();
    f.set_len(0).unwrap();
    bitmap_file.write_at(0, &area);
    let x = run(&mdadm, &["--examine-bitmap"], &bitmap_file);
    check_examine_bitmap(&x, &bms);

    // On a block device mdadm finds the bitmap through our superblock's bitmap_offset.
    match LoopDevice::attach(&image.path) {
        Some(dev) => {
            let x = run_path(&mdadm, &["--examine-bitmap"], &dev.path);
            check_examine_bitmap(&x, &bms);
        }
        None => uraid_testkit::skip(
            "mdadm_examines_our_internal_bitmap",
            "no loop device (needs root and losetup); -X checked on a file only",
        ),
    }
}

fn check_examine_bitmap(x: &str, bms: &BitmapSuper) {
    assert_eq!(field(x, "Magic"), "6d746962");
    assert_eq!(field(x, "Version"), "4");
    assert_eq!(field(x, "UUID"), uuid_string(&SET_UUID));
    assert_eq!(field(x, "Events"), "0");
    assert_eq!(field(x, "Events Cleared"), "0");
    assert_eq!(field(x, "State"), "OK");
    assert_eq!(field(x, "Chunksize"), "64 MB");
    assert_eq!(field(x, "Daemon"), "5s flush period");
    assert_eq!(field(x, "Write Mode"), "Normal");
    let sync = field(x, "Sync Size");
    assert!(
        sync.starts_with(&format!("{} ", bms.sync_size / 2)),
        "{sync}"
    );
    let chunks = bms.chunks();
    assert_eq!(
        field(x, "Bitmap"),
        format!("{chunks} bits (chunks), {chunks} dirty (100.0%)")
    );
}

/// A read-only loop device over an image, detached on drop.
struct LoopDevice {
    path: PathBuf,
}

impl LoopDevice {
    fn attach(image: &Path) -> Option<LoopDevice> {
        let out = Command::new("losetup")
            .args(["--find", "--show", "--read-only"])
            .arg(image)
            .output()
            .ok()?;
        if !out.status.success() {
            return None;
        }
        let path = PathBuf::from(String::from_utf8(out.stdout).ok()?.trim());
        Some(LoopDevice { path })
    }
}

impl Drop for LoopDevice {
    fn drop(&mut self) {
        let _ = Command::new("losetup")
            .arg("--detach")
            .arg(&self.path)
            .status();
    }
}

/// Metadata 1.0 and 1.1 members (with and without an internal bitmap), written where their
/// version puts the superblock: `mdadm --examine` finds them there and agrees on the
/// version, offsets, unused space, bitmap and bad block log.
#[test]
fn mdadm_examines_our_v10_and_v11_superblocks() {
    let Some(mdadm) = mdadm("mdadm_examines_our_v10_and_v11_superblocks") else {
        return;
    };
    for version in [MetadataVersion::V1_0, MetadataVersion::V1_1] {
        for with_bitmap in [false, true] {
            let at_end = version.at_end();
            let data_offset = if at_end {
                0
            } else {
                default_data_offset_sectors(
                    DEVICE_SECTORS,
                    0,
                    default_bitmap_space_sectors(DEVICE_SECTORS),
                )
            };
            let avail = if at_end {
                v10_avail_sectors(DEVICE_SECTORS)
            } else {
                DEVICE_SECTORS - data_offset
            };
            let size = avail / 128 * 128;
            let bms = BitmapSuper::new(SET_UUID, size, 64 << 20, 5).unwrap();
            let space = bms.space_bytes() / 512;
            let bitmap = with_bitmap.then(|| {
                let offset = if at_end {
                    v10_bitmap_offset(space).unwrap()
                } else {
                    8
                };
                (offset, space)
            });
            let spec = CreateSpec {
                level: 1,
                layout: 0,
                chunk_sectors: 0,
                raid_disks: 2,
                size_sectors: size,
                data_offset_sectors: data_offset,
                internal_bitmap: bitmap,
                clean: true,
                version,
                ..spec_for(&CASES[1])
            };
            let mut sb = Superblock::new_for_create(&spec, 0, DEVICE_UUID, DEVICE_SECTORS).unwrap();
            sb.events = 5;
            let image = Image::new(&format!("v{}-{with_bitmap}", version.name()));
            image.write_at(sb.super_offset * 512, &sb.encode());
            if let Some(at) = sb.bitmap_sector() {
                let mut b = bms.clone();
                b.events = 5;
                image.write_at(at * 512, &b.encode());
            }
            let out = run(&mdadm, &["--examine"], &image);
            let what = format!("{version} bitmap={with_bitmap}:\n{out}");
            assert_eq!(field(&out, "Version"), version.name(), "{what}");
            assert_eq!(
                field(&out, "Feature Map"),
                format!("{:#x}", sb.feature_map),
                "{what}"
            );
            if sb.data_offset != 0 {
                assert_eq!(
                    field(&out, "Data Offset"),
                    format!("{} sectors", sb.data_offset),
                    "{what}"
                );
            } else {
                assert!(
                    !out.contains("Data Offset"),
                    "mdadm shows no data offset of 0: {what}"
                );
            }
            assert_eq!(
                field(&out, "Super Offset"),
                format!("{} sectors", sb.super_offset),
                "{what}"
            );
            assert!(
                field(&out, "Avail Dev Size").starts_with(&format!("{} sectors", sb.data_size)),
                "{what}"
            );
            // Unused space before the data and after it (up to the device's end for 1.1,
            // up to the bitmap/log/superblock for 1.0), as mdadm counts it.
            // mdadm's getinfo_super1: for 1.0 the gap between the component's end and the
            // lowest of bitmap, log and superblock; for 1.1 the data offset less the 36 KiB
            // the kernel keeps after the superblock, and the device's end after the data.
            let (before, after) = if at_end {
                let lowest = [sb.bitmap_sector(), sb.bblog_sector().map(|b| b.0)]
                    .into_iter()
                    .flatten()
                    .fold(sb.super_offset, u64::min);
                (0, lowest - sb.size)
            } else {
                (
                    sb.data_offset - 72,
                    DEVICE_SECTORS - sb.data_offset - sb.size,
                )
            };
            assert_eq!(
                field(&out, "Unused Space"),
                format!("before={before} sectors, after={after} sectors"),
                "{what}"
            );
            if let Some(at) = sb.bitmap_sector() {
                assert_eq!(
                    field(&out, "Internal Bitmap"),
                    format!(
                        "{} sectors from superblock",
                        at as i64 - sb.super_offset as i64
                    ),
                    "{what}"
                );
            }
            let (log_at, log_size) = sb.bblog_sector().expect("a bad block log");
            assert_eq!(
                field(&out, "Bad Block Log"),
                format!(
                    "{} entries available at offset {} sectors",
                    u32::from(log_size) * 512 / 8,
                    log_at as i64 - sb.super_offset as i64
                ),
                "{what}"
            );
            assert!(field(&out, "Checksum").ends_with("- correct"), "{what}");
        }
    }
}
