//! sgl-operator
