print("go driver: todo")
