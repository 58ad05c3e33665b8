//! Everything a command-line test usually needs, for one `use uraid_testkit::prelude::*;`
//! (a test's own item of the same name wins over these).

pub use crate::cli::{
    examine, examine_says, fails_cleanly, fails_with, json, json_exact, mdadm_field, ok, run,
    stdout, test_state_dir, text, uraid, uraid_bin, SYNC,
};
pub use crate::data::{byte_pattern, checksums, pattern, snapshot, write_at};
pub use crate::loopdev::Loop;
pub use crate::served::{
    check_engine, create_array, fio_args, fio_check, member_states, nbd_size, qemu_io, ChildGuard,
    Nbdkit, Served,
};
pub use crate::skip::{need_tool, need_tools, skip, tool_path};
pub use crate::tmp::{TempDir, MIB};
