// NotebookEdit: replace, insert or delete one cell of a Jupyter notebook (nbformat 4).
#include <random>
#include <system_error>

#include "builtin_tools.h"
#include "cuda_agent/core/error.h"
#include "cuda_agent/core/files.h"

namespace cuda_agent::agent {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// nbformat stores source as a list of lines, each but the last ending in "\n".
json source_lines(const std::string& source) {
  json lines = json::array();
  size_t begin = 0;
  while (begin < source.size()) {
    size_t end = source.find('\n', begin);
    end = end == std::string::npos ? source.size() : end + 1;
    lines.push_back(source.substr(begin, end - begin));
    begin = end;
  }
  return lines;
}

// A fresh cell id (nbformat 4.5: 1-64 characters of [a-zA-Z0-9-_]), unique in `cells`.
std::string new_cell_id(const json& cells) {
  static thread_local std::mt19937_64 engine{std::random_device{}()};
  for (;;) {
    const std::string id = fmt::format("{:08x}", engine() & 0xffffffffu);
    bool taken = false;
    for (const auto& cell : cells) taken = taken || cell.value("id", std::string()) == id;
    if (!taken) return id;
  }
}

// Makes `cell` a well-formed cell of `type`: code cells have outputs and execution_count
// (cleared, as the source changed), others have neither.
void set_cell_type(json& cell, const std::string& type) {
  cell["cell_type"] = type;
  if (!cell.contains("metadata")) cell["metadata"] = json::object();
  if (type == "code") {
    cell["outputs"] = json::array();
    cell["execution_count"] = nullptr;
  } else {
    cell.erase("outputs");
    cell.erase("execution_count");
  }
}

class NotebookEditTool final : public BuiltinTool {
 public:
  using BuiltinTool::BuiltinTool;
  std::string name() const override { return "NotebookEdit"; }

  json schema() const override {
    return function_schema(
        name(),
        "Edits one cell of a Jupyter notebook (.ipynb, nbformat 4). edit_mode \"replace\" "
        "(default) sets the source of the cell (clearing a code cell's outputs), \"insert\" "
        "adds a new cell, \"delete\" removes the cell. Name the cell by cell_id or by "
        "cell_number (0-based). insert puts the new cell after the cell named by cell_id, at "
        "index cell_number, or first when neither is given; it needs cell_type.",
        {{"notebook_path",
          {{"type", "string"},
           {"description", "Path of the .ipynb file, relative to the workspace root or "
                           "absolute"}}},
         {"cell_id", {{"type", "string"}, {"description", "The id of the cell"}}},
         {"cell_number", {{"type", "integer"}, {"description", "The index of the cell "
                                                               "(0-based)"}}},
         {"new_source",
          {{"type", "string"},
           {"description", "The new source of the cell (replace and insert)"}}},
         {"cell_type",
          {{"type", "string"}, {"enum", {"code", "markdown"}},
           {"description", "The cell's type; required for insert"}}},
         {"edit_mode",
          {{"type", "string"}, {"enum", {"replace", "insert", "delete"}},
           {"description", "replace (default), insert or delete"}}}},
        {"notebook_path"});
  }

 protected:
  ToolResult execute(const json& args) override {
    const fs::path path = workspace().resolve(string_arg(args, "notebook_path"));
    const std::string shown = display_path(workspace(), path);
    if (path.extension() != ".ipynb") {
      return tool_error(fmt::format("{} is not a notebook (.ipynb); use Edit for other files",
                                    shown));
    }
    if (workspace().is_locked(path)) return tool_error(locked_message(workspace(), path));
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
      return tool_error(fmt::format("{} does not exist; create it with Write", shown));
    }
    json notebook = json::parse(workspace().read_inside(path, kEditedFileMaxBytes), nullptr, false);
    if (notebook.is_discarded() || !notebook.is_object() || !notebook.contains("cells") ||
        !notebook.at("cells").is_array()) {
      return tool_error(fmt::format("{} is not a valid notebook: it must be JSON with a "
                                    "\"cells\" array", shown));
    }
    if (notebook.value("nbformat", 0) != 4) {
      return tool_error(fmt::format("{} has nbformat {}; only nbformat 4 is supported", shown,
                                    notebook.value("nbformat", json(nullptr)).dump()));
    }
    json& cells = notebook["cells"];
    const std::string mode = string_arg(args, "edit_mode", "replace");
    if (has_arg(args, "cell_id") && has_arg(args, "cell_number")) {
      return tool_error("give cell_id or cell_number, not both");
    }
    if (mode != "delete" && !has_arg(args, "new_source")) {
      return tool_error(fmt::format("edit_mode {} needs new_source", mode));
    }

    // The cell named by cell_id or cell_number; -1 when neither names one.
    int64_t index = -1;
    if (has_arg(args, "cell_id")) {
      const std::string id = string_arg(args, "cell_id");
      for (size_t i = 0; i < cells.size() && index < 0; ++i) {
        if (cells[i].value("id", std::string()) == id) index = static_cast<int64_t>(i);
      }
      if (index < 0) return tool_error(fmt::format("{} has no cell with id '{}'", shown, id));
    } else if (has_arg(args, "cell_number")) {
      index = int_arg(args, "cell_number", -1);
      const auto size = static_cast<int64_t>(cells.size());
      const int64_t limit = mode == "insert" ? size : size - 1;
      if (index < 0 || index > limit) {
        return tool_error(fmt::format("cell_number {} is out of range: {} has {} cells "
                                      "(0-based numbers)", index, shown, size));
      }
    }

    std::string done;
    if (mode == "insert") {
      if (!has_arg(args, "cell_type")) return tool_error("insert needs cell_type (code or "
                                                         "markdown)");
      // After the cell named by id; at the index given by number; first otherwise.
      const int64_t at = has_arg(args, "cell_id") ? index + 1 : std::max<int64_t>(index, 0);
      json cell = {{"metadata", json::object()},
                   {"source", source_lines(string_arg(args, "new_source"))}};
      const bool with_ids = notebook.value("nbformat_minor", 0) >= 5 ||
                            (!cells.empty() && cells[0].contains("id"));
      if (with_ids) cell["id"] = new_cell_id(cells);
      set_cell_type(cell, string_arg(args, "cell_type"));
      cells.insert(cells.begin() + at, cell);
      index = at;
      done = fmt::format("Inserted a {} cell at index {}", string_arg(args, "cell_type"), at);
    } else {
      if (index < 0) return tool_error(fmt::format("{} needs cell_id or cell_number", mode));
      if (mode == "delete") {
        cells.erase(cells.begin() + index);
        done = fmt::format("Deleted cell {}", index);
      } else {
        json& cell = cells[index];
        const std::string type =
            string_arg(args, "cell_type", cell.value("cell_type", std::string("code")));
        cell["source"] = source_lines(string_arg(args, "new_source"));
        set_cell_type(cell, type);
        done = fmt::format("Replaced the source of cell {}", index);
      }
    }
    workspace().write_inside(path, notebook.dump(1, ' ', false, json::error_handler_t::replace) + "\n");
    ToolResult result;
    result.output = fmt::format("{} of {} ({} cells now).", done, shown, cells.size());
    result.data = {{"path", shown}, {"cell_index", index}, {"cells", cells.size()}};
    if (mode != "delete" && cells[index].contains("id")) result.data["cell_id"] = cells[index]["id"];
    return result;
  }
};

}  // namespace

std::unique_ptr<Tool> make_notebook_edit_tool(ToolContext& context) {
  return std::make_unique<NotebookEditTool>(context);
}

}  // namespace cuda_agent::agent
