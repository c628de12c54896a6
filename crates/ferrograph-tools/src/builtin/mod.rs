//! Built-in tools: [`FsTools`] (`read_file`, `list_dir`, `grep`, confined to a root
//! directory) and [`SearchTool`] (`rag_search`, `docs_search` over any [`Searcher`]).

pub mod fs;
pub mod search;

pub use fs::{
    DirEntry, DirListing, FsLimits, FsTools, GrepArgs, GrepTool, ListDirArgs, ListDirTool,
    ReadFileArgs, ReadFileTool,
};
pub use search::{SearchArgs, SearchHit, SearchTool, Searcher};
