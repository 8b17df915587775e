//! SGLang: client (being built).
