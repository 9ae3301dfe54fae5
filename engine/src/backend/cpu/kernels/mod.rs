//! CPU numeric kernels
