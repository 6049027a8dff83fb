//! The accept engine: conflict check, journal, staged writes, atomic renames, recovery.
//! (Being implemented; see the module plan in DESIGN.md "Accept".)
