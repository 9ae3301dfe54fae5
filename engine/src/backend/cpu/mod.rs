//! cpu backend
