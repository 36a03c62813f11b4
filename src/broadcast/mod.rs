//! The reader-generation broadcast area (in progress).
