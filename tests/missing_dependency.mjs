// The node tests' counterpart of src/base/testing/missing_dependency.h: a test that cannot run because something
// `./dev setup` installs (npm packages) is missing. skipForMissingDependency(why) prints `why` and exits 77 (CTest's
// skip, SKIP_RETURN_CODE); with PARSYN_REQUIRE_ALL=1 in the environment (CI's .ci/run sets it) it exits 1 instead,
// since there a missing dependency means a missing install step.
export function skipForMissingDependency(why) {
  const required = process.env.PARSYN_REQUIRE_ALL === '1';
  console.log(`${required ? 'FAILED (PARSYN_REQUIRE_ALL=1)' : 'SKIPPED'}: ${why}`);
  process.exit(required ? 1 : 77);
}
