//! The copy-on-write B+tree engine (boltdb/redb lineage). Being written.
