//! Rendering results for people (tables) and scripts (JSON). Pure: values in, strings out.
