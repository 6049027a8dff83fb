//! Running a command inside a branch mount (being implemented).
