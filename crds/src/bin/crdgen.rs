//! Prints the `SGLangService` CustomResourceDefinition as YAML.

fn main() -> Result<(), sgl_crds::CrdError> {
    print!("{}", sgl_crds::crd_yaml()?);
    Ok(())
}
