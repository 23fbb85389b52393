# The torch found by the build's Python: its version, headers (with its bundled pybind11),
# libraries and C++ ABI. Shared by hetobs._torch_ext and the stand-in device
# (standin/CMakeLists.txt). Sets HETOBS_TORCH_FOUND and, when found, HETOBS_TORCH_VERSION,
# HETOBS_TORCH_INCLUDES, HETOBS_TORCH_LIBS and HETOBS_TORCH_CXX11_ABI; HETOBS_TORCH_ERR
# says why not.
execute_process(
  COMMAND ${Python_EXECUTABLE} -c
    "import torch, torch.utils.cpp_extension as c; print(torch.__version__); print(','.join(c.include_paths())); print(c.library_paths()[0]); print(int(torch._C._GLIBCXX_USE_CXX11_ABI))"
  RESULT_VARIABLE _hetobs_torch_rc OUTPUT_VARIABLE _hetobs_torch_info ERROR_VARIABLE HETOBS_TORCH_ERR
  OUTPUT_STRIP_TRAILING_WHITESPACE)
set(HETOBS_TORCH_FOUND OFF)
if(_hetobs_torch_rc EQUAL 0)
  set(HETOBS_TORCH_FOUND ON)
  string(REPLACE "\n" ";" _hetobs_torch_info "${_hetobs_torch_info}")
  list(GET _hetobs_torch_info 0 HETOBS_TORCH_VERSION)
  list(GET _hetobs_torch_info 1 HETOBS_TORCH_INCLUDES)
  list(GET _hetobs_torch_info 2 _hetobs_torch_libdir)
  list(GET _hetobs_torch_info 3 HETOBS_TORCH_CXX11_ABI)
  string(REPLACE "," ";" HETOBS_TORCH_INCLUDES "${HETOBS_TORCH_INCLUDES}")
  set(HETOBS_TORCH_LIBS "")
  foreach(_lib torch torch_cpu c10 torch_python)
    find_library(HETOBS_LIB_${_lib} ${_lib} PATHS ${_hetobs_torch_libdir} NO_DEFAULT_PATH REQUIRED)
    list(APPEND HETOBS_TORCH_LIBS ${HETOBS_LIB_${_lib}})
  endforeach()
endif()

# Compile `target` as an extension of that torch: its headers first (its pybind11 must win
# over the pip one), its ABI, its libraries, and an rpath to them next to the package.
function(hetobs_torch_target target)
  target_include_directories(${target} BEFORE PRIVATE ${HETOBS_TORCH_INCLUDES})
  target_compile_features(${target} PRIVATE cxx_std_20)
  target_compile_definitions(${target} PRIVATE _GLIBCXX_USE_CXX11_ABI=${HETOBS_TORCH_CXX11_ABI})
  target_compile_options(${target} PRIVATE -Wall -Wextra -Wno-unused-parameter -O2)
  target_link_libraries(${target} PRIVATE ${HETOBS_TORCH_LIBS})
  set_target_properties(${target} PROPERTIES CXX_VISIBILITY_PRESET hidden INSTALL_RPATH "$ORIGIN/../torch/lib")
endfunction()
