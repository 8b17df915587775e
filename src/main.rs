//! The `fleet` binary: all of it is `fleet::commands::entry`, so the release build compiles the
//! command dispatch once, in the library.

fn main() -> std::process::ExitCode {
    fleet::commands::entry::main()
}
