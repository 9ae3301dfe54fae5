//! A batch that mixes decodes with prompts: which sequences take the decode form, the split into
//! the two groups run apart, and their results put back in batch order.

use crate::backend::SeqInput;

/// Whether a sequence runs in the decode form (the decode attention kernel, CUDA graphs): one
/// token, and under `--enable-deterministic-inference` not a prompt's. There a prompt's last
/// token takes the prefill kernel whether the rest of its prompt is in the radix cache or not,
/// so a cached prompt gives the fresh prompt's logits bit for bit (the two kernels sum the
/// keys in different orders).
pub(super) fn decode_form(q: &SeqInput<'_>, deterministic: bool) -> bool {
    q.tokens.len() == 1 && !(deterministic && q.prompt)
}

/// Splits a batch that mixes decode-form sequences ([`decode_form`]) with prompts into the two
/// groups' indices, each in batch order. Run apart, the decodes go through the decode
/// attention kernel (and a CUDA graph within `--cuda-graph-max-bs`) instead of taking a
/// one-row tile each in the prefill kernel. `None` when the batch is all one kind.
pub(super) fn split_mixed(
    batch: &[SeqInput<'_>],
    deterministic: bool,
) -> Option<(Vec<usize>, Vec<usize>)> {
    let (decodes, prompts): (Vec<usize>, Vec<usize>) =
        (0..batch.len()).partition(|&i| decode_form(&batch[i], deterministic));
    (!decodes.is_empty() && !prompts.is_empty()).then_some((decodes, prompts))
}

/// Puts per-sequence results of the two groups of [`split_mixed`] back in batch order:
/// `take(i)` is how many items sequence `i` has in its group's output.
pub(super) fn merge_groups<T: Copy>(
    n: usize,
    groups: [(&[usize], &[T]); 2],
    take: impl Fn(usize) -> usize,
) -> Vec<T> {
    let mut group_of = vec![(0usize, 0usize); n];
    for (g, (idx, _)) in groups.iter().enumerate() {
        for (k, &i) in idx.iter().enumerate() {
            group_of[i] = (g, k);
        }
    }
    // Offsets of each sequence's items inside its group's output.
    let mut starts = [Vec::new(), Vec::new()];
    for (g, (idx, _)) in groups.iter().enumerate() {
        let mut at = 0;
        for &i in idx.iter() {
            starts[g].push(at);
            at += take(i);
        }
    }
    let mut out = Vec::new();
    for (i, &(g, k)) in group_of.iter().enumerate() {
        let at = starts[g][k];
        let items = groups[g].1;
        out.extend_from_slice(&items[at.min(items.len())..(at + take(i)).min(items.len())]);
    }
    out
}

#[cfg(test)]
mod split_tests {
    use super::merge_groups;

    #[test]
    fn merged_groups_come_back_in_batch_order() {
        // Sequences 0..5; 1 and 3 are decodes (one row each), 0, 2, 4 prompts with 2, 0 and
        // 3 rows.
        let rows = [2usize, 1, 0, 1, 3];
        let decodes = [1usize, 3];
        let prompts = [0usize, 2, 4];
        let a = [10, 30];
        let b = [0, 0, 40, 40, 40];
        let merged = merge_groups(5, [(&decodes, &a), (&prompts, &b)], |i| rows[i]);
        assert_eq!(merged, vec![0, 0, 10, 30, 40, 40, 40]);
    }
}
