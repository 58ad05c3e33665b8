//! md v1.2 superblock codec (see docs/FORMAT.md).
