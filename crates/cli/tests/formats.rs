//! The arrays people bring: superblocks uraid cannot honour are refused by name with every
//! member left byte-identical, and metadata 1.0 / 1.1 members are created, found and served
//! like 1.2 ones (mdadm --examine agreeing).

use std::path::{Path, PathBuf};
use std::process::Command;
use uraid_core::superblock::{
    MetadataVersion, Superblock, FEATURE_CLUSTERED, FEATURE_PPL, FEATURE_RESHAPE_ACTIVE,
};
use uraid_testkit::prelude::*;

/// `uraid` with the sync IO engine.
fn uraid() -> Command {
    let mut c = uraid_testkit::cli::uraid();
    c.args(SYNC);
    c
}

/// The command refuses, says every one of `needles`, and writes nothing.
fn fails_cleanly(cmd: &mut Command, files: &[PathBuf], needles: &[&str]) -> String {
    let err = uraid_testkit::cli::fails_cleanly(cmd, files);
    for n in needles {
        assert!(err.contains(n), "{cmd:?}: expected {n:?} in: {err}");
    }
    err
}

fn read_sb(path: &Path) -> Superblock {
    let bytes = std::fs::read(path).unwrap();
    let dev_sectors = bytes.len() as u64 / 512;
    for v in MetadataVersion::ALL {
        let at = v.super_offset_sectors(dev_sectors).unwrap() as usize * 512;
        if let Ok(sb) = Superblock::decode(&bytes[at..at + 4096]) {
            if sb.super_offset as usize * 512 == at {
                return sb;
            }
        }
    }
    panic!("{}: no superblock", path.display());
}

fn write_sb(path: &Path, sb: &Superblock) {
    use std::os::unix::fs::FileExt;
    let f = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    f.write_all_at(&sb.encode(), sb.super_offset * 512).unwrap();
}

fn create_raid5(d: &TempDir, prefix: &str, extra: &[&str]) -> (Vec<PathBuf>, Vec<u8>) {
    let imgs = d.images(4, 8, prefix);
    ok(uraid()
        .args(["create", "-l", "5", "-c", "16K", "-N", "shelf"])
        .args(extra)
        .args(&imgs));
    let data = byte_pattern(1 << 20, 11);
    let input = d.0.join(format!("{prefix}.bin"));
    std::fs::write(&input, &data).unwrap();
    ok(uraid().args(["write", "--input"]).arg(&input).args(&imgs));
    (imgs, data)
}

/// Every command that opens the array refuses it, names the array, the member and the
/// feature, says what to do, and writes nothing.
fn every_open_refuses(imgs: &[PathBuf], needles: &[&str]) {
    let d = imgs[0].parent().unwrap();
    let sock = d.join("ctl.sock");
    let cmds: Vec<Vec<std::ffi::OsString>> = vec![
        vec!["assemble".into()],
        vec!["assemble".into(), "--force".into()],
        vec!["detail".into()],
        vec!["read".into(), "--length".into(), "4096".into()],
        vec!["write".into(), "--input".into(), "/dev/null".into()],
        vec!["check".into(), "-q".into()],
        vec!["resync".into()],
        vec![
            "serve".into(),
            "--nbd".into(),
            d.join("nbd.sock").into(),
            "--control".into(),
            sock.into(),
        ],
    ];
    for c in cmds {
        let err = fails_cleanly(uraid().args(&c).args(imgs), imgs, needles);
        assert_eq!(
            err.matches("uraid will not open it").count(),
            1,
            "said once: {err}"
        );
    }
}

#[test]
fn a_raid5_stopped_mid_reshape_into_raid6_is_refused_and_left_untouched() {
    let d = TempDir::new("reshape");
    let (imgs, _) = create_raid5(&d, "r", &[]);
    // As Linux md leaves a raid5 growing from 4 to 5 disks, stopped half way.
    for img in &imgs {
        let mut sb = read_sb(img);
        sb.feature_map |= FEATURE_RESHAPE_ACTIVE;
        sb.reshape_position = 6144;
        sb.delta_disks = 1;
        // Growing into raid6: uraid reads only restripes within one level (a raid5 grow
        // is read, see the engine's reshape_read tests).
        sb.new_level = 6;
        sb.new_layout = sb.layout;
        sb.new_chunk = sb.chunksize;
        write_sb(img, &sb);
    }
    let uuid = uraid_core::superblock::uuid_string(&read_sb(&imgs[0]).set_uuid);
    every_open_refuses(
        &imgs,
        &[
            &uuid,
            ":shelf",
            imgs[0].to_str().unwrap(),
            "FEATURE_RESHAPE_ACTIVE",
            "reshape is in progress at sector 6144",
            "assemble it with Linux md / mdadm to finish the reshape",
        ],
    );
    // examine still shows it (it only reads).
    ok(uraid().arg("examine").arg(&imgs[0]));
}

#[test]
fn clustered_and_ppl_members_are_refused_by_name() {
    let d = TempDir::new("feat");
    for (i, (bit, name)) in [
        (FEATURE_CLUSTERED, "FEATURE_CLUSTERED"),
        (FEATURE_PPL, "FEATURE_PPL"),
    ]
    .into_iter()
    .enumerate()
    {
        let (imgs, _) = create_raid5(&d, &format!("f{i}"), &[]);
        // One member is enough: it is named.
        let mut sb = read_sb(&imgs[2]);
        sb.feature_map |= bit;
        write_sb(&imgs[2], &sb);
        every_open_refuses(&imgs, &[imgs[2].to_str().unwrap(), name]);
    }
}

fn mdadm() -> Option<PathBuf> {
    tool_path("mdadm", "formats: mdadm comparison")
}

#[test]
fn metadata_10_and_11_arrays_are_created_read_and_examined() {
    let md = mdadm();
    for e in ["1.0", "1.1"] {
        for bitmap in ["none", "internal"] {
            for level in ["1", "5"] {
                let d = TempDir::new(&format!("v{e}-{bitmap}-{level}"));
                let imgs = d.images(3, 12, "m");
                ok(uraid()
                    .args(["create", "-e", e, "-l", level, "-c", "64K", "-b", bitmap])
                    .args(&imgs));
                let data = byte_pattern(3 << 20, 5);
                let input = d.0.join("in.bin");
                std::fs::write(&input, &data).unwrap();
                ok(uraid()
                    .args(["write", "--offset", "8192", "--input"])
                    .arg(&input)
                    .args(&imgs));
                let out = ok(uraid()
                    .args(["read", "--offset", "8192", "--length"])
                    .arg(data.len().to_string())
                    .args(&imgs));
                let ctx = format!("-e {e} -b {bitmap} -l {level}");
                assert!(out.stdout == data, "{ctx}: read back differs");
                let chk = ok(uraid().args(["check", "-q"]).args(&imgs));
                assert_eq!(
                    String::from_utf8_lossy(&chk.stdout).trim(),
                    "mismatch_cnt: 0",
                    "{ctx}"
                );
                for img in &imgs {
                    let sb = read_sb(img);
                    let size = std::fs::metadata(img).unwrap().len() / 512;
                    let v = MetadataVersion::parse(e).unwrap();
                    assert_eq!(
                        sb.super_offset,
                        v.super_offset_sectors(size).unwrap(),
                        "{ctx}"
                    );
                    assert_eq!(sb.version(), v);
                    if v.at_end() {
                        assert_eq!(sb.data_offset, 0, "{ctx}");
                        assert!(
                            sb.data_offset + sb.data_size <= sb.super_offset - 8,
                            "{ctx}"
                        );
                    } else {
                        assert!(sb.data_offset >= 2048, "{ctx}");
                    }
                    // The data really starts at data_offset: 1.0 members of a raid1 hold the
                    // array's bytes from sector 0.
                    if v.at_end() && level == "1" {
                        let raw = std::fs::read(img).unwrap();
                        assert!(
                            raw[8192..8192 + data.len()] == data[..],
                            "{ctx}: not at sector 0"
                        );
                    }
                    let ex: serde_json::Value = serde_json::from_slice(
                        &ok(uraid().args(["examine", "--json"]).arg(img)).stdout,
                    )
                    .unwrap();
                    assert_eq!(ex["version"], e, "{ctx}");
                    let Some(md) = &md else { continue };
                    let out = Command::new(md).arg("--examine").arg(img).output().unwrap();
                    assert!(out.status.success(), "{ctx}: mdadm --examine failed");
                    let text = String::from_utf8_lossy(&out.stdout);
                    let ctx = format!("{ctx}:\n{text}");
                    assert_eq!(mdadm_field(&text, "Version").as_deref(), Some(e), "{ctx}");
                    assert_eq!(
                        mdadm_field(&text, "Super Offset"),
                        Some(format!("{} sectors", sb.super_offset)),
                        "{ctx}"
                    );
                    assert_eq!(
                        mdadm_field(&text, "Feature Map"),
                        Some(format!("{:#x}", sb.feature_map)),
                        "{ctx}"
                    );
                    assert_eq!(
                        mdadm_field(&text, "State").as_deref(),
                        Some("clean"),
                        "{ctx}"
                    );
                    if let Some(at) = sb.bitmap_sector() {
                        assert_eq!(
                            mdadm_field(&text, "Internal Bitmap"),
                            Some(format!(
                                "{} sectors from superblock",
                                at as i64 - sb.super_offset as i64
                            )),
                            "{ctx}"
                        );
                        // md's bitmap superblock ("bitm", version 4) where the offset says.
                        let raw = std::fs::read(img).unwrap();
                        let b = &raw[at as usize * 512..];
                        assert_eq!(&b[..4], b"bitm", "{ctx}: no bitmap at sector {at}");
                        assert_eq!(b[4], 4, "{ctx}");
                    }
                    let (log, _) = sb.bblog_sector().expect("a bad block log");
                    assert_eq!(
                        mdadm_field(&text, "Bad Block Log"),
                        Some(format!(
                            "512 entries available at offset {} sectors",
                            log as i64 - sb.super_offset as i64
                        )),
                        "{ctx}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_stale_10_superblock_under_a_12_one() {
    let d = TempDir::new("stale");
    let imgs = d.images(2, 8, "s");
    ok(uraid()
        .args(["create", "-e", "1.0", "-l", "1", "-N", "old"])
        .args(&imgs));
    // Made a day earlier, as a stale superblock would be.
    for img in &imgs {
        let mut sb = read_sb(img);
        sb.ctime -= 86_400;
        write_sb(img, &sb);
    }
    let old: Vec<Superblock> = imgs.iter().map(|i| read_sb(i)).collect();
    ok(uraid()
        .args(["create", "--run", "-e", "1.2", "-l", "1", "-N", "new"])
        .args(&imgs));
    // The 1.2 create did not reach the 1.0 superblock at the end.
    let bytes = std::fs::read(&imgs[0]).unwrap();
    let at = old[0].super_offset as usize * 512;
    assert!(
        Superblock::decode(&bytes[at..at + 4096]).is_ok(),
        "the stale 1.0 superblock is gone"
    );
    let ex: serde_json::Value =
        serde_json::from_slice(&ok(uraid().args(["examine", "--json"]).arg(&imgs[0])).stdout)
            .unwrap();
    assert_eq!(
        ex["version"], "1.2",
        "mdadm takes the newer (larger ctime) one"
    );
    assert!(ex["name"].as_str().unwrap().ends_with(":new"));
    ok(uraid().arg("detail").args(&imgs));
    // Same creation time: there is no telling which is current.
    for (img, o) in imgs.iter().zip(&old) {
        let mut sb = o.clone();
        sb.ctime = read_sb(img).ctime; // read_sb takes the first it finds: the 1.0 one
        let new_ctime = {
            let b = std::fs::read(img).unwrap();
            Superblock::decode(&b[4096..8192]).unwrap().ctime
        };
        sb.ctime = new_ctime;
        write_sb(img, &sb);
    }
    fails_cleanly(
        uraid().arg("examine").arg(&imgs[0]),
        &imgs,
        &["1.0", "1.2", "same time"],
    );
    fails_cleanly(
        uraid().arg("assemble").args(&imgs),
        &imgs,
        &["1.0", "1.2", "same time"],
    );
}

#[test]
fn a_10_member_whose_device_grew_is_named() {
    let d = TempDir::new("grown");
    let imgs = d.images(2, 8, "g");
    ok(uraid().args(["create", "-e", "1.0", "-l", "1"]).args(&imgs));
    std::fs::OpenOptions::new()
        .write(true)
        .open(&imgs[1])
        .unwrap()
        .set_len(9 << 20)
        .unwrap();
    fails_cleanly(
        uraid().arg("examine").arg(&imgs[1]),
        &imgs,
        &["1.0", "grown", "no longer at the end"],
    );
    fails_cleanly(
        uraid().arg("assemble").args(&imgs),
        &imgs,
        &["no longer at the end"],
    );
}

/// `uraid grow --bitmap internal` on a 1.0 array (a boot mirror, a QNAP data array) puts
/// the bitmap where mdadm's --grow does: between the data and the bad block log under the
/// superblock. mdadm --examine and --examine-bitmap read it: in step (the same events),
/// clean, its size the component's; and the data is what it was.
#[test]
fn a_bitmap_is_added_to_a_1_0_array_where_mdadm_adds_it() {
    let d = TempDir::new("v10-grow-bitmap");
    let imgs = d.images(2, 64, "m");
    ok(uraid()
        .args(["create", "-e", "1.0", "-l", "1", "-b", "none"])
        .args(&imgs));
    let data = byte_pattern(8 << 20, 7);
    let input = d.0.join("in.bin");
    std::fs::write(&input, &data).unwrap();
    ok(uraid().args(["write", "--input"]).arg(&input).args(&imgs));
    ok(uraid().args(["grow", "--bitmap", "internal"]).args(&imgs));
    let out = ok(uraid()
        .args(["read", "--length"])
        .arg(data.len().to_string())
        .args(&imgs));
    assert!(out.stdout == data, "the data changed");
    for img in &imgs {
        let sb = read_sb(img);
        let at = sb.bitmap_sector().expect("no bitmap in the superblock");
        // Below the log and the superblock, above the data.
        assert!(sb.bitmap_offset < sb.bblog_offset, "{}", img.display());
        assert!(at >= sb.data_offset + sb.data_size, "{}", img.display());
        let Some(md) = mdadm() else { continue };
        let ex = Command::new(&md)
            .arg("--examine")
            .arg(img)
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&ex.stdout);
        assert_eq!(
            mdadm_field(&text, "Internal Bitmap"),
            Some(format!("{} sectors from superblock", sb.bitmap_offset)),
            "{text}"
        );
        // mdadm --examine-bitmap finds an internal bitmap only on a block device.
        let test = "a_bitmap_is_added_to_a_1_0_array_where_mdadm_adds_it";
        let Some(lo) = uraid_testkit::loopdev::Loop::attach_or_skip(img, test) else {
            continue;
        };
        let x = Command::new(&md).arg("-X").arg(&lo.0).output().unwrap();
        drop(lo);
        let xt = String::from_utf8_lossy(&x.stdout);
        assert!(x.status.success(), "mdadm -X failed:\n{xt}");
        assert_eq!(
            mdadm_field(&xt, "Events"),
            mdadm_field(&text, "Events"),
            "bitmap and superblock events differ:\n{xt}\n{text}"
        );
        let bits = mdadm_field(&xt, "Bitmap").unwrap_or_default();
        assert!(bits.contains(" bits (chunks), 0 dirty"), "{xt}");
        assert!(
            mdadm_field(&xt, "Sync Size")
                .unwrap_or_default()
                .starts_with(&format!("{} ", sb.size / 2)),
            "{xt}"
        );
    }
    let chk = ok(uraid().args(["check", "-q"]).args(&imgs));
    assert_eq!(
        String::from_utf8_lossy(&chk.stdout).trim(),
        "mismatch_cnt: 0"
    );
}
