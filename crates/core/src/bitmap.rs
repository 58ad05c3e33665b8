//! md write-intent bitmap superblock codec (see docs/FORMAT.md).
