# tandem_install_split_debug(<target> <destination>): at install time, the installed file keeps only what it
# needs to run (stripped of debug sections) and its debug info goes to <destination>/.debug/<file>.debug,
# linked back with a GNU debuglink (gdb and perf find it there). RelWithDebInfo's libtandem is ~15x
# smaller stripped. TANDEM_INSTALL_SPLIT_DEBUG=OFF installs the file as built.
option(TANDEM_INSTALL_SPLIT_DEBUG "Install binaries stripped, their debug info in .debug/ beside them" ON)
function(tandem_install_split_debug target destination)
  if(NOT TANDEM_INSTALL_SPLIT_DEBUG OR NOT CMAKE_OBJCOPY OR NOT CMAKE_STRIP)
    return()
  endif()
  install(CODE "
    set(_file \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${destination}/$<TARGET_FILE_NAME:${target}>\")
    set(_dir \"\$ENV{DESTDIR}\${CMAKE_INSTALL_PREFIX}/${destination}/.debug\")
    file(MAKE_DIRECTORY \"\${_dir}\")
    set(_debug \"\${_dir}/$<TARGET_FILE_NAME:${target}>.debug\")
    execute_process(COMMAND \"${CMAKE_OBJCOPY}\" --only-keep-debug \"\${_file}\" \"\${_debug}\" RESULT_VARIABLE _r1)
    execute_process(COMMAND \"${CMAKE_STRIP}\" --strip-debug --strip-unneeded \"\${_file}\" RESULT_VARIABLE _r2)
    execute_process(COMMAND \"${CMAKE_OBJCOPY}\" \"--add-gnu-debuglink=\${_debug}\" \"\${_file}\" RESULT_VARIABLE _r3)
    if(_r1 OR _r2 OR _r3)
      message(FATAL_ERROR \"splitting the debug info of \${_file} failed (\${_r1} \${_r2} \${_r3})\")
    endif()
    message(STATUS \"Split debug info: \${_debug}\")")
endfunction()
