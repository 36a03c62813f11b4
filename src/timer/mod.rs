//! The XOR-order timeout index (in progress).
