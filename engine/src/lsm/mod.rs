//! The log-structured merge engine (leveldb lineage). Being written.
