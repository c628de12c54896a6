//! Built-in tools: [`FsTools`] (`read_file`, `list_dir`, `grep`, confined to a root directory).

pub mod fs;

pub use fs::{
    DirEntry, DirListing, FsLimits, FsTools, GrepArgs, GrepTool, ListDirArgs, ListDirTool,
    ReadFileArgs, ReadFileTool,
};
