//! sgl-router
