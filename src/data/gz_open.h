// Opening a data file for reading through zlib (gzip or plain), for the readers of
// data/readers.cpp and data/csv.cpp: a FIFO or a device is refused rather than waited on.
#pragma once
#include <string>

struct gzFile_s;

namespace sat {

// The open file (sat::Error "PATH: cannot open (why)" when it cannot be).
gzFile_s* gz_open_data(const std::string& path);

}  // namespace sat
