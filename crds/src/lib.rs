//! sgl-crds
