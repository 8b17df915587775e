//! `sglang-sim`: a stand-in for SGLang's server; the program lives in `fleet::sim`.

fn main() -> std::process::ExitCode {
    fleet::sim::main()
}
