use std::collections::HashMap;

use ::safetensors::tensor::TensorView;

use super::*;
use crate::model::error::LoadError;

/// A safetensors file holding `w`: f32 `[4, 6]` with value `10 * row + col`, and `b`: bf16 `[4]`.
fn fixture(dir: &std::path::Path) -> std::path::PathBuf {
    let w: Vec<u8> = (0..4)
        .flat_map(|r| (0..6).map(move |c| (10 * r + c) as f32))
        .flat_map(f32::to_le_bytes)
        .collect();
    let b: Vec<u8> = [1.0f32, 2.0, 3.0, 4.0]
        .iter()
        .flat_map(|v| bf16::from_f32(*v).to_le_bytes())
        .collect();
    let mut tensors = HashMap::new();
    tensors.insert(
        "w".to_string(),
        TensorView::new(::safetensors::Dtype::F32, vec![4, 6], &w).expect("view"),
    );
    tensors.insert(
        "b".to_string(),
        TensorView::new(::safetensors::Dtype::BF16, vec![4], &b).expect("view"),
    );
    let path = dir.join("model.safetensors");
    ::safetensors::serialize_to_file(&tensors, None, &path).expect("write");
    path
}

fn values(t: &Tensor<'_>) -> Vec<f32> {
    t.to_f32().expect("f32")
}

#[test]
fn safetensors_reads_whole_tensors_from_the_mapping() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = SafetensorsFiles::open(&[fixture(dir.path())]).expect("open");
    let w = files.read("w", Shard::Whole).expect("w");
    assert_eq!(w.dtype, DType::F32);
    assert_eq!(w.shape, vec![4, 6]);
    assert!(matches!(w.bytes, Cow::Borrowed(_)));
    assert_eq!(values(&w)[7], 11.0);
    let b = files.read("b", Shard::Whole).expect("b");
    assert_eq!(values(&b), vec![1.0, 2.0, 3.0, 4.0]);
    assert_eq!(b.to_bf16().expect("bf16")[3], bf16::from_f32(4.0));
    assert!(files.contains("w") && !files.contains("x"));
    assert!(matches!(
        files.read("x", Shard::Whole),
        Err(LoadError::MissingTensor { .. })
    ));
}

#[test]
fn shards_take_a_rank_share_of_rows_or_columns() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = SafetensorsFiles::open(&[fixture(dir.path())]).expect("open");
    let rows = files
        .read("w", Shard::Rows { rank: 1, parts: 2 })
        .expect("rows");
    assert_eq!(rows.shape, vec![2, 6]);
    assert!(matches!(rows.bytes, Cow::Borrowed(_)));
    assert_eq!(values(&rows)[0], 20.0);
    assert_eq!(values(&rows)[11], 35.0);
    let cols = files
        .read("w", Shard::Cols { rank: 2, parts: 3 })
        .expect("cols");
    assert_eq!(cols.shape, vec![4, 2]);
    assert_eq!(
        values(&cols),
        vec![4.0, 5.0, 14.0, 15.0, 24.0, 25.0, 34.0, 35.0]
    );
    let bias = files
        .read("b", Shard::Rows { rank: 3, parts: 4 })
        .expect("bias");
    assert_eq!(values(&bias), vec![4.0]);
    for bad in [
        Shard::Rows { rank: 0, parts: 3 },
        Shard::Cols { rank: 4, parts: 4 },
        Shard::Cols { rank: 0, parts: 0 },
    ] {
        assert!(
            matches!(files.read("w", bad), Err(LoadError::Layout { .. })),
            "{bad:?} should not split [4, 6]"
        );
    }
}

#[test]
fn a_shape_that_differs_names_the_tensor() {
    let dir = tempfile::tempdir().expect("tempdir");
    let files = SafetensorsFiles::open(&[fixture(dir.path())]).expect("open");
    let err = files
        .read("w", Shard::Whole)
        .and_then(|t| t.expect_shape(&[6, 4]))
        .expect_err("wrong shape");
    assert_eq!(
        err.to_string(),
        "tensor w has shape [4, 6], expected [6, 4]"
    );
}

#[test]
fn a_truncated_safetensors_file_is_an_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = fixture(dir.path());
    let bytes = std::fs::read(&path).expect("read");
    std::fs::write(&path, &bytes[..bytes.len() - 4]).expect("write");
    assert!(matches!(
        SafetensorsFiles::open(&[path]),
        Err(LoadError::Safetensors { .. })
    ));
}

/// The GGUF reader's mapped bytes are the bytes candle reads for the same tensor.
#[test]
fn gguf_tensors_match_candles_reader() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let out = std::process::Command::new("bash")
        .arg(root.join("scripts/fetch-model.sh"))
        .output()
        .expect("run scripts/fetch-model.sh");
    assert!(out.status.success(), "fetch-model.sh failed");
    let path = std::path::PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
    let gguf = GgufFile::open(&path).expect("open");
    let mut file = std::fs::File::open(&path).expect("file");
    for name in [
        "token_embd.weight",
        "blk.0.attn_q.weight",
        "blk.3.ffn_norm.weight",
    ] {
        let ours = gguf.read(name, Shard::Whole).expect("read");
        let theirs = gguf
            .content()
            .tensor(&mut file, name, &candle_core::Device::Cpu)
            .expect("candle");
        assert_eq!(ours.shape, theirs.shape().dims().to_vec(), "{name}");
        assert_eq!(ours.dtype, DType::from_ggml(theirs.dtype()), "{name}");
        assert_eq!(&*ours.bytes, &*theirs.data().expect("data"), "{name}");
    }
}
