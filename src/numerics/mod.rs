//! Host reference numerics.
