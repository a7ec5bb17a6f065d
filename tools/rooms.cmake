# The rooms of src/lineage/ and their one-way arrows (docs/architecture.md): each room lists the
# rooms it builds directly on; it may include and link those and everything they build on, never a
# room above. Read by the top-level CMakeLists.txt (one static library per room) and by
# tools/check_layers.cmake (the #include check), so the two cannot disagree.
set(LINEAGE_ROOMS core dist kernels layers model tokenizer chat io runtime serve plot train study)
set(LINEAGE_ROOM_core)
set(LINEAGE_ROOM_dist core)
set(LINEAGE_ROOM_kernels core)
set(LINEAGE_ROOM_layers kernels)
set(LINEAGE_ROOM_model layers)
set(LINEAGE_ROOM_tokenizer core)
set(LINEAGE_ROOM_chat tokenizer)
set(LINEAGE_ROOM_io model tokenizer)
set(LINEAGE_ROOM_runtime io)
set(LINEAGE_ROOM_serve runtime chat)
set(LINEAGE_ROOM_plot core)
set(LINEAGE_ROOM_train runtime plot)
set(LINEAGE_ROOM_study train)

# Every room `room` may use: its arrows followed to the end, in an order a static link accepts
# (each room before the rooms it uses).
function(lineage_room_closure room out)
  set(seen "")
  set(todo ${LINEAGE_ROOM_${room}})
  while(todo)
    list(POP_FRONT todo r)
    if(NOT r IN_LIST LINEAGE_ROOMS)
      message(FATAL_ERROR "tools/rooms.cmake: room '${room}' builds on '${r}', which is no room")
    endif()
    if(NOT r IN_LIST seen)
      list(APPEND seen ${r})
      list(APPEND todo ${LINEAGE_ROOM_${r}})
    endif()
  endwhile()
  # LINEAGE_ROOMS lists every room after the ones it uses: walk it backwards for the link order.
  set(ordered "")
  foreach(r IN LISTS LINEAGE_ROOMS)
    if(r IN_LIST seen)
      list(PREPEND ordered ${r})
    endif()
  endforeach()
  set(${out} ${ordered} PARENT_SCOPE)
endfunction()
