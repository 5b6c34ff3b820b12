//! The demo's own framework: a two-hidden-layer MLP over summed token embeddings, its forward
//! and backward on the CPU, and a synthetic teacher task. Nothing here knows the optimizer.
//!
//! For an example of `context` token ids `t₁…t_c` (each in `0..vocab`):
//! `x = Σ E[tᵢ]`, `h₁ = tanh(W₁x + b₁)`, `h₂ = tanh(W₂h₁ + b₂)`, `y = W_out h₂ + b_out`; the
//! loss is the mean squared error against a fixed, randomly initialised teacher of the same
//! shape.

use muon_opt::config::Dtype;
use muon_opt::model::{ParamFlags, ParamSpec};
use muon_opt::numerics::gemm::{Output, Strides, gemm};
use muon_opt::rng::SplitMix64;

/// Sizes of the model and the task.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
pub struct Dims {
    pub vocab: usize,
    pub embed: usize,
    pub hidden: usize,
    pub out: usize,
    /// Tokens per example; their embeddings are summed.
    pub context: usize,
}

/// Param ids in registration (forward) order.
pub const EMBEDDING: usize = 0;
pub const FC1: usize = 1;
pub const FC1_BIAS: usize = 2;
pub const FC2: usize = 3;
pub const FC2_BIAS: usize = 4;
pub const HEAD: usize = 5;
pub const HEAD_BIAS: usize = 6;

/// One value per element of every param, indexed by param id.
pub type Weights = Vec<Vec<f32>>;

impl Dims {
    /// The parameter list in registration order. `adamw_only` opts the hidden matrices out
    /// of Muon; the embedding and the output head are always AdamW's, biases are 1-D.
    pub fn specs(&self, adamw_only: bool) -> Vec<ParamSpec> {
        let (v, e, h, o) = (
            self.vocab as u64,
            self.embed as u64,
            self.hidden as u64,
            self.out as u64,
        );
        let spec = |name: &str, shape: &[u64], flags: u32| {
            let mut spec = ParamSpec::new(name, shape, Dtype::F32);
            spec.flags = ParamFlags(flags);
            spec
        };
        let hidden_flags = if adamw_only { ParamFlags::NO_MUON } else { 0 };
        vec![
            spec("embedding.weight", &[v, e], ParamFlags::EMBEDDING_OR_OUTPUT),
            spec("fc1.weight", &[h, e], hidden_flags),
            spec("fc1.bias", &[h], ParamFlags::NO_WEIGHT_DECAY),
            spec("fc2.weight", &[h, h], hidden_flags),
            spec("fc2.bias", &[h], ParamFlags::NO_WEIGHT_DECAY),
            spec("head.weight", &[o, h], ParamFlags::EMBEDDING_OR_OUTPUT),
            spec("head.bias", &[o], ParamFlags::NO_WEIGHT_DECAY),
        ]
    }

    /// Random weights: uniform with variance `gain² / fan_in` for the matrices, unit-range
    /// embeddings, zero biases; `head_gain` scales the output head.
    pub fn init(&self, seed: u64, gain: f32, head_gain: f32) -> Weights {
        let mut rng = SplitMix64::new(seed);
        let mut uniform = |n: usize, scale: f32| (0..n).map(|_| scale * rng.uniform()).collect::<Vec<f32>>();
        let fan = |n: usize| gain * (3.0 / n as f32).sqrt();
        let (v, e, h, o) = (self.vocab, self.embed, self.hidden, self.out);
        vec![
            uniform(v * e, 1.0),
            uniform(h * e, fan(e * self.context)),
            vec![0.0; h],
            uniform(h * h, fan(h)),
            vec![0.0; h],
            uniform(o * h, head_gain * fan(h)),
            vec![0.0; o],
        ]
    }
}

/// A batch of examples: `context` token ids per example and the teacher's outputs.
pub struct Batch {
    pub tokens: Vec<usize>,
    pub targets: Vec<f32>,
}

impl Batch {
    /// `size` random examples drawn from `seed`, labelled by `teacher`.
    pub fn sample(dims: &Dims, teacher: &Weights, seed: u64, size: usize) -> Batch {
        let mut rng = SplitMix64::new(seed);
        let tokens: Vec<usize> = (0..size * dims.context).map(|_| rng.below(dims.vocab)).collect();
        let targets = forward(dims, teacher, &tokens).y;
        Batch { tokens, targets }
    }
}

/// The activations of one forward pass, row-major with one row per example.
pub struct Activations {
    pub x: Vec<f32>,
    pub h1: Vec<f32>,
    pub h2: Vec<f32>,
    pub y: Vec<f32>,
}

/// A row-major matrix view, possibly transposed.
#[derive(Clone, Copy)]
struct View<'a> {
    data: &'a [f32],
    rows: usize,
    cols: usize,
    transposed: bool,
}

impl<'a> View<'a> {
    fn new(data: &'a [f32], rows: usize, cols: usize) -> Self {
        assert_eq!(data.len(), rows * cols, "matrix view of {rows}x{cols}");
        View {
            data,
            rows,
            cols,
            transposed: false,
        }
    }

    fn t(self) -> Self {
        View {
            rows: self.cols,
            cols: self.rows,
            transposed: !self.transposed,
            ..self
        }
    }

    /// The view's shape and strides.
    fn strides(self) -> Strides {
        if self.transposed {
            Strides::row_major(self.cols, self.rows).transposed()
        } else {
            Strides::row_major(self.rows, self.cols)
        }
    }
}

/// `c = a·b + beta·c` for a `rows(a)×cols(b)` row-major `c`, on the calling thread.
fn matmul(a: View, b: View, beta: f32, c: &mut [f32]) {
    let out = Strides::row_major(a.rows, b.cols);
    gemm(
        1.0,
        (a.data, a.strides()),
        (b.data, b.strides()),
        beta,
        (c, out),
        Output::Full,
        1,
    );
}

/// `out[r, :] += bias` for every row, then `tanh` when `activate`.
fn add_bias(out: &mut [f32], bias: &[f32], activate: bool) {
    for row in out.chunks_exact_mut(bias.len()) {
        for (v, b) in row.iter_mut().zip(bias) {
            *v += b;
            if activate {
                *v = v.tanh();
            }
        }
    }
}

/// Sum over rows of a row-major matrix with `cols` columns.
fn column_sums(m: &[f32], cols: usize) -> Vec<f32> {
    let mut sums = vec![0.0f32; cols];
    for row in m.chunks_exact(cols) {
        for (s, v) in sums.iter_mut().zip(row) {
            *s += v;
        }
    }
    sums
}

/// Multiplies `grad` by tanh' at the activations `h` (= 1 − h²).
fn tanh_backward(grad: &mut [f32], h: &[f32]) {
    for (g, h) in grad.iter_mut().zip(h) {
        *g *= 1.0 - h * h;
    }
}

/// The forward pass of `w` on `tokens` (`context` per example).
pub fn forward(dims: &Dims, w: &[Vec<f32>], tokens: &[usize]) -> Activations {
    let (e, h, o) = (dims.embed, dims.hidden, dims.out);
    let n = tokens.len() / dims.context;
    let mut x = vec![0.0f32; n * e];
    for (row, example) in x.chunks_exact_mut(e).zip(tokens.chunks_exact(dims.context)) {
        for &t in example {
            for (v, w) in row.iter_mut().zip(&w[EMBEDDING][t * e..(t + 1) * e]) {
                *v += w;
            }
        }
    }
    let mut h1 = vec![0.0f32; n * h];
    matmul(View::new(&x, n, e), View::new(&w[FC1], h, e).t(), 0.0, &mut h1);
    add_bias(&mut h1, &w[FC1_BIAS], true);
    let mut h2 = vec![0.0f32; n * h];
    matmul(View::new(&h1, n, h), View::new(&w[FC2], h, h).t(), 0.0, &mut h2);
    add_bias(&mut h2, &w[FC2_BIAS], true);
    let mut y = vec![0.0f32; n * o];
    matmul(View::new(&h2, n, h), View::new(&w[HEAD], o, h).t(), 0.0, &mut y);
    add_bias(&mut y, &w[HEAD_BIAS], false);
    Activations { x, h1, h2, y }
}

/// Mean squared error over every output of every example.
pub fn loss(y: &[f32], targets: &[f32]) -> f64 {
    let sum: f64 = y.iter().zip(targets).map(|(y, t)| f64::from(y - t).powi(2)).sum();
    sum / y.len() as f64
}

/// The backward pass of [`loss`]: hands each param's gradient to `ready(param, grad)` as soon
/// as it is final, in reverse registration order (what a framework's backward hooks see), and
/// stops at the first error `ready` returns.
pub fn backward<E>(
    dims: &Dims,
    w: &[Vec<f32>],
    tokens: &[usize],
    acts: &Activations,
    targets: &[f32],
    mut ready: impl FnMut(usize, &[f32]) -> Result<(), E>,
) -> Result<(), E> {
    let (e, h, o) = (dims.embed, dims.hidden, dims.out);
    let n = tokens.len() / dims.context;
    let scale = 2.0 / (n * o) as f32;
    let dy: Vec<f32> = acts.y.iter().zip(targets).map(|(y, t)| scale * (y - t)).collect();
    ready(HEAD_BIAS, &column_sums(&dy, o))?;
    let mut grad = vec![0.0f32; o * h];
    matmul(View::new(&dy, n, o).t(), View::new(&acts.h2, n, h), 0.0, &mut grad);
    ready(HEAD, &grad)?;

    let mut dz2 = vec![0.0f32; n * h];
    matmul(View::new(&dy, n, o), View::new(&w[HEAD], o, h), 0.0, &mut dz2);
    tanh_backward(&mut dz2, &acts.h2);
    ready(FC2_BIAS, &column_sums(&dz2, h))?;
    let mut grad = vec![0.0f32; h * h];
    matmul(View::new(&dz2, n, h).t(), View::new(&acts.h1, n, h), 0.0, &mut grad);
    ready(FC2, &grad)?;

    let mut dz1 = vec![0.0f32; n * h];
    matmul(View::new(&dz2, n, h), View::new(&w[FC2], h, h), 0.0, &mut dz1);
    tanh_backward(&mut dz1, &acts.h1);
    ready(FC1_BIAS, &column_sums(&dz1, h))?;
    let mut grad = vec![0.0f32; h * e];
    matmul(View::new(&dz1, n, h).t(), View::new(&acts.x, n, e), 0.0, &mut grad);
    ready(FC1, &grad)?;

    let mut dx = vec![0.0f32; n * e];
    matmul(View::new(&dz1, n, h), View::new(&w[FC1], h, e), 0.0, &mut dx);
    let mut grad = vec![0.0f32; dims.vocab * e];
    for (row, example) in dx.chunks_exact(e).zip(tokens.chunks_exact(dims.context)) {
        for &t in example {
            for (g, d) in grad[t * e..(t + 1) * e].iter_mut().zip(row) {
                *g += d;
            }
        }
    }
    ready(EMBEDDING, &grad)
}

#[cfg(test)]
mod tests {
    use std::convert::Infallible;

    use super::*;

    const DIMS: Dims = Dims {
        vocab: 7,
        embed: 3,
        hidden: 5,
        out: 2,
        context: 2,
    };

    /// The analytic gradient of every param matches central differences of the loss.
    #[test]
    fn backward_matches_finite_differences() {
        let teacher = DIMS.init(1, 1.5, 1.0);
        let batch = Batch::sample(&DIMS, &teacher, 2, 4);
        let mut w = DIMS.init(3, 1.0, 1.0);
        for (p, values) in w.iter_mut().enumerate() {
            if p == FC1_BIAS || p == FC2_BIAS || p == HEAD_BIAS {
                values
                    .iter_mut()
                    .enumerate()
                    .for_each(|(i, v)| *v = 0.1 * (i as f32 - 1.0));
            }
        }
        let acts = forward(&DIMS, &w, &batch.tokens);
        let mut grads: Weights = vec![Vec::new(); w.len()];
        let mut order = Vec::new();
        let Ok(()) = backward::<Infallible>(&DIMS, &w, &batch.tokens, &acts, &batch.targets, |p, g| {
            order.push(p);
            grads[p] = g.to_vec();
            Ok(())
        });
        assert_eq!(order, (0..w.len()).rev().collect::<Vec<_>>());
        let eps = 1e-2f32;
        for p in 0..w.len() {
            for i in 0..w[p].len() {
                let original = w[p][i];
                w[p][i] = original + eps;
                let plus = loss(&forward(&DIMS, &w, &batch.tokens).y, &batch.targets);
                w[p][i] = original - eps;
                let minus = loss(&forward(&DIMS, &w, &batch.tokens).y, &batch.targets);
                w[p][i] = original;
                let numeric = (plus - minus) / (2.0 * f64::from(eps));
                let analytic = f64::from(grads[p][i]);
                assert!(
                    (numeric - analytic).abs() <= 1e-3 + 1e-2 * numeric.abs(),
                    "param {p} element {i}: numeric {numeric} analytic {analytic}"
                );
            }
        }
    }
}
