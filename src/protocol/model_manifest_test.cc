#include "protocol/model_manifest.h"

#include <gtest/gtest.h>

namespace parsyn::protocol {
namespace {

TEST(ModelManifestTest, ReadsACustomModelsManifest) {
  StatusOr<ModelManifest> m = ParseModelManifest(
      R"({"kind": "custom", "trainer": "digits-cnn", "files": ["model.safetensors", "net/cnn.py"]})");
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  EXPECT_EQ(m->trainer, "digits-cnn");
  EXPECT_EQ(m->files, (std::vector<std::string>{"model.safetensors", "net/cnn.py"}));
}

TEST(ModelManifestTest, EachProblemIsNamed) {
  const std::pair<const char*, const char*> cases[] = {
      {R"({"kind": "keras", "trainer": "t", "files": ["model.safetensors"]})",
       "parsyn_model.json: kind must be \"custom\" (the only kind of model a manifest describes), got \"keras\""},
      {R"({"kind": "custom", "trainer": "a b", "files": ["model.safetensors"]})",
       "parsyn_model.json: trainer must be a trainer name (1..64 letters, digits, '_', '.' or '-'), got \"a b\""},
      {R"({"kind": "custom", "trainer": "t", "files": ["../etc/passwd"]})",
       "parsyn_model.json: files holds \"../etc/passwd\", not a path within the folder"},
      {R"({"kind": "custom", "trainer": "t", "files": ["cnn.py"]})",
       "parsyn_model.json: files must name model.safetensors, or model.safetensors.index.json for a sharded "
       "checkpoint (the weights the workers train)"},
      {R"({"kind": "custom", "files": ["model.safetensors"], "extra": 1})",
       "parsyn_model.json: trainer is required; unknown field extra"},
  };
  for (const auto& [text, message] : cases) {
    StatusOr<ModelManifest> m = ParseModelManifest(text);
    EXPECT_EQ(m.status().code(), StatusCode::kInvalidArgument) << text;
    EXPECT_EQ(m.status().message(), message) << text;
  }
}

}  // namespace
}  // namespace parsyn::protocol
