//! Element-wise passes compiled for the widest vector extension the CPU has.
//!
//! The crate is built for baseline x86-64 (SSE2), so a loop the compiler vectorizes runs four
//! f32 lanes at a time. [`Isa::run`] calls a pass from a function compiled with AVX2 or
//! AVX-512 (the pass is inlined into it, so its loops are vectorized for that extension),
//! chosen at run time by what the CPU reports. Only the vector width changes: the compiler
//! keeps every floating-point operation and its order whatever the target features (Rust
//! neither contracts `a·b + c` into an FMA nor reassociates sums), so the bits are those of
//! the portable pass (each pass using it is tested against it).

/// A vector extension a pass can be compiled for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Isa {
    /// The crate's target (SSE2 on x86-64).
    Portable,
    /// AVX2 (256-bit lanes).
    Avx2,
    /// AVX-512 F (512-bit lanes).
    Avx512,
}

impl Isa {
    /// The widest extension this CPU has.
    pub fn detected() -> Isa {
        Isa::supported().last().unwrap_or(Isa::Portable)
    }

    /// Every extension this CPU has, narrowest first (always `Portable`).
    pub fn supported() -> impl Iterator<Item = Isa> {
        [Isa::Portable, Isa::Avx2, Isa::Avx512]
            .into_iter()
            .filter(|isa| isa.is_supported())
    }

    fn is_supported(self) -> bool {
        match self {
            Isa::Portable => true,
            #[cfg(target_arch = "x86_64")]
            Isa::Avx2 => std::arch::is_x86_feature_detected!("avx2"),
            #[cfg(target_arch = "x86_64")]
            Isa::Avx512 => std::arch::is_x86_feature_detected!("avx512f"),
            #[cfg(not(target_arch = "x86_64"))]
            Isa::Avx2 | Isa::Avx512 => false,
        }
    }

    /// Runs `pass` compiled for this extension; an extension the CPU lacks runs the portable
    /// pass.
    #[inline(always)]
    pub fn run<R>(self, pass: impl FnOnce() -> R) -> R {
        #[cfg(target_arch = "x86_64")]
        {
            if self.is_supported() {
                match self {
                    // SAFETY: the CPU supports every feature `run_avx512` is compiled with.
                    Isa::Avx512 => return unsafe { run_avx512(pass) },
                    // SAFETY: the CPU supports every feature `run_avx2` is compiled with.
                    Isa::Avx2 => return unsafe { run_avx2(pass) },
                    Isa::Portable => {}
                }
            }
        }
        pass()
    }
}

/// Runs `pass` compiled for the widest extension this CPU has ([`Isa::detected`]).
#[inline(always)]
pub fn widest<R>(pass: impl FnOnce() -> R) -> R {
    Isa::detected().run(pass)
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx512f,avx2")]
fn run_avx512<R>(pass: impl FnOnce() -> R) -> R {
    pass()
}

#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
fn run_avx2<R>(pass: impl FnOnce() -> R) -> R {
    pass()
}
