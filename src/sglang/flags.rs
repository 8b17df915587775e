//! SGLang: flags (being built).
