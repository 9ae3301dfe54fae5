fn main() {
    println!("sgl-engine");
}
